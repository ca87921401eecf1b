"""Lesson 30: count what a rank's collectives send, for the lesson's scripts to import.

    from wire import wire

    counts = {}
    with wire(counts):   # every collective called as dist.<name> in here is counted
        ...
    # counts: {"all_reduce": calls, ..., "bytes": the bytes of their whole tensors}

The hooks, ZeRO and FSDP2 call the collectives as attributes of torch.distributed, so
replacing those attributes for a while sees every call. DDP's own all-reduce runs in C++
and is not seen: register `allreduce_hook` to count it.
"""

import contextlib

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "broadcast", "all_gather_single", "reduce_scatter_single",
               "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather", "reduce_scatter")


def nbytes(value):
    """The bytes of a tensor, or of a list of tensors, together; 0 for anything else."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


@contextlib.contextmanager
def wire(counts):
    """Count the calls and the bytes of this rank's collectives while inside: the whole
    tensor, not a shard (what an all-gather assembles, what a reduce-scatter splits)."""
    real = {name: getattr(dist, name) for name in COLLECTIVES}

    def counted(name):
        def call(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            counts["bytes"] = counts.get("bytes", 0) + max(
                nbytes(value) for value in (*args, *kwargs.values()))
            return real[name](*args, **kwargs)
        return call
    for name in COLLECTIVES:
        setattr(dist, name, counted(name))
    try:
        yield counts
    finally:
        for name, function in real.items():
            setattr(dist, name, function)
