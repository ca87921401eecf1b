"""Exercise (lesson 11): the mean of a tensor over the ranks, for floating-point and integer
tensors alike, on Gloo. Rank r holds [r + 1, r + 2, r + 3] in each dtype; rank 0 writes
what each dtype gave on every rank as JSON.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/11_backends/mean_exercise.py
"""

import torch
import torch.distributed as dist
from ddp_common import arguments, record, report, setup, teardown

DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


def mean_over_ranks(tensor):
    """A new floating-point tensor holding the mean of `tensor` over all ranks; `tensor`
    itself is left as it is, whatever its dtype."""
    # STUB: result = tensor.clone()
    # STUB: dist.all_reduce(result, op=dist.ReduceOp.AVG)
    # STUB: return result
    ### BEGIN SOLUTION
    total = tensor.to(torch.float64, copy=True)  # integers are exact in float64 up to 2**53
    dist.all_reduce(total)  # SUM: every backend has it, for every dtype
    return total / dist.get_world_size()
    ### END SOLUTION


@record  # on failure, torchrun's report shows this rank's traceback (lesson 01)
def main():
    parser = arguments(__doc__)
    parser.set_defaults(device="cpu")  # CPU tensors and Gloo unless asked (lesson 02)
    parser.add_argument("--timeout", type=float, default=20, help="seconds, then Gloo gives up")
    args = parser.parse_args()
    rank, _, _, device = setup(args.device, timeout_s=args.timeout)
    found = {}
    for dtype in DTYPES:
        mine = torch.arange(1, 4, dtype=dtype, device=device) + rank
        try:
            mean = mean_over_ranks(mine)
        except (RuntimeError, ValueError) as error:  # raised on every rank alike
            found[str(dtype)] = {"error": str(error).splitlines()[0]}
            continue
        found[str(dtype)] = {"mean": mean.tolist(), "dtype": str(mean.dtype),
                             "input_kept": mine.tolist() == (torch.arange(1, 4) + rank).tolist()}
    report(args.out, found)  # rank 0 writes every rank's results, for the check
    teardown()


if __name__ == "__main__":
    main()
