"""Lesson 26, exercise 2: the new world that ddp_scripts/26_elastic/elastic_resume_exercise.py's
resume() starts. Not a script of its own: the exercise calls run_exercise(resume).

Every rank builds the model with other initial weights than the job's (seed 1) and calls
resume() twice: on a folder with no complete checkpoint (--first, an empty one by default:
a job's first start; it must return 0 and change nothing), then on --dir. It reports the
step and what each rank then holds (weights and SGD momentum, by parameter name); with
--to, it trains on to that step as elastic_train.py does, and rank 0 reports each loss."""

import sys
import tempfile
from pathlib import Path

import torch
from ddp_common import arguments, record, report, setup, teardown
from digits_data import load_data, make_model
from elastic_train import step_samples, train_step
from torch.nn.parallel import DistributedDataParallel as DDP


def held(model, optimizer):
    """{name: [values]} of this rank's weights, and of its momentum (None before a step)."""
    named = list(model.module.named_parameters())
    momentum = {name: optimizer.state.get(p, {}).get("momentum_buffer") for name, p in named}
    return ({name: p.detach().flatten().tolist() for name, p in named},
            {name: None if m is None else m.flatten().tolist() for name, m in momentum.items()})


@record
def run_exercise(resume):
    parser = arguments(sys.modules["__main__"].__doc__, device=False)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/elastic-job"),
                        help="the job's folder of checkpoints, as elastic_train.py writes it")
    parser.add_argument("--first", type=Path, help="a folder with no complete checkpoint "
                        "(default: an empty one of each rank's own)")
    parser.add_argument("--to", type=int, help="train on to this step after the resume")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--micro", type=int, default=16, help="samples per micro-batch")
    args = parser.parse_args()
    world = setup("cpu", timeout_s=20, ddp=True)
    model = DDP(make_model(1))  # not the job's initial weights: a resume must replace them
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    before = held(model, optimizer), optimizer.state_dict()["param_groups"]
    with tempfile.TemporaryDirectory() as empty:
        first_start = resume(args.first or Path(empty), model, optimizer)
    untouched = (held(model, optimizer), optimizer.state_dict()["param_groups"]) == before
    step = resume(args.dir, model, optimizer)
    weights, momentum = held(model, optimizer)
    x, y = load_data(0)[0].tensors
    losses = {}
    for s in range(step, args.to or step):
        samples = step_samples(s, len(x), args.global_batch, seed=0)
        losses[s + 1] = train_step(model, optimizer, x, y, samples, args.micro, world)
    report(args.out, {"rank": world.rank, "first_start": first_start, "untouched": untouched,
                      "step": step, "weights": weights, "momentum": momentum}, losses=losses)
    del model
    teardown()
