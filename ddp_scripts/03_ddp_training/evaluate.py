"""Lesson 03, section 2: a model's accuracy on the digits' test set three ways:
on one process; split across the ranks naively (DistributedSampler's padded shards, the
ranks' accuracies averaged); and right (sums and counts all-reduced, divided once). The
model is untrained: what differs is the counting, not the model.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/03_ddp_training/evaluate.py
"""

from ddp_common import arguments, record, report, setup, teardown
from digits_data import evaluate, load_data, make_model


@record
def main():
    args = arguments(__doc__).parse_args()
    world = setup(args.device)
    _, test = load_data(seed=0)
    model = make_model(seed=0).to(world.device)  # the same weights on every rank
    scores = evaluate(model, test, world.rank, world.world_size, world.device)
    report(args.out, {}, test_size=len(test), **scores)
    teardown()


if __name__ == "__main__":
    main()
