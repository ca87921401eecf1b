"""Lesson 04, section 3: DDP keeps your model as `module`, so a DDP model's state_dict
names every tensor `module.<name>`. Which state dicts load into a plain model?

    torchrun --standalone --nproc-per-node=2 ddp_scripts/04_checkpointing/module_prefix.py
"""

from ddp_common import arguments, record, report, setup, teardown
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as DDP
from training_run import make_model


def loads_exactly(model, state_dict):
    """Every key matches: none missing, none left over."""
    result = model.load_state_dict(state_dict, strict=False)
    return not (result.missing_keys or result.unexpected_keys)


@record
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device, ddp=True)
    ddp = DDP(make_model().to(world.device),
              device_ids=[world.device.index] if world.device.type == "cuda" else None)
    wrapped, inner = ddp.state_dict(), ddp.module.state_dict()
    del ddp  # the DDP model goes before the group does (lesson 02 says why)
    plain = make_model()
    try:
        plain.load_state_dict(wrapped)
        error = None
    except RuntimeError as e:
        error = str(e)
    stripped = dict(wrapped)
    consume_prefix_in_state_dict_if_present(stripped, "module.")
    report(args.out, {}, ddp_keys=list(wrapped), module_keys=list(inner), error=error,
           wrapped_loads=loads_exactly(plain, wrapped),
           module_state_dict_loads=loads_exactly(plain, inner),
           stripped_loads=loads_exactly(plain, stripped))
    teardown()


if __name__ == "__main__":
    main()
