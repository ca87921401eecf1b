"""Lesson 30, section 3: torch.compile on a DDP model.

Dynamo's DDPOptimizer splits the compiled graph where DDP's buckets end: the graphs counted
for three ways to combine the two (compile(DDP(Stack)), compile(DDP(nn.Sequential)),
DDP(compile(nn.Sequential))) and compared with eager DDP; the first steps timed with
--backend; a bucket cap under 1 MiB refused.
    torchrun --standalone --nproc-per-node=2 ddp_scripts/30_beyond_allreduce/compile.py
"""

import time

import torch
import torch.nn as nn
from ddp_common import arguments, record, report, setup, teardown
from torch.nn.parallel import DistributedDataParallel as DDP


class Stack(nn.Module):
    """Four layers of 512 x 512: 1 MiB of float32 weights each."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(512, 512) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def sequential():  # the same layers as Stack, in torch's own container
    return nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())))


def compiled(rank, device, backend):
    """torch.compile on a DDP model: graphs, equality, compile time, a failure."""
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(rank)).to(device)
    graphs = []

    def counting(graph_module, example_inputs):  # a backend: note each graph, run it as is
        graphs.append(len(graph_module.graph.nodes))
        return graph_module.forward

    def build(make, inside=False, **ddp_kwargs):
        torch.compiler.reset()  # forget what earlier compiles cached
        graphs.clear()
        torch.manual_seed(0)
        inner = make().to(device)
        if inside:  # compile the inner model, then wrap it: DDP calls the compiled model
            inner = torch.compile(inner, backend=counting)
        return DDP(inner, **ddp_kwargs)

    found = {}
    for name, make in (("compile(DDP(Stack))", Stack), ("compile(DDP(Sequential))", sequential),
                       ("DDP(compile(Sequential))", sequential)):
        eager = build(make, bucket_cap_mb=1)
        model = build(make, inside=name.startswith("DDP"), bucket_cap_mb=1)
        out = (model if name.startswith("DDP") else torch.compile(model, backend=counting))(x)
        out.sum().backward()
        reference = eager(x)
        reference.sum().backward()
        found[name] = {"graphs": len(graphs), "output_gap": (out - reference).abs().max().item(),
                       "grad_gap": max((p.grad - q.grad).abs().max().item() for p, q in
                                       zip(model.parameters(), eager.parameters()))}
        del model, eager
    model = build(Stack, bucket_cap_mb=1)
    run = torch.compile(model, backend=backend)
    seconds = []
    for _ in range(6):
        start = time.perf_counter()
        run(x).sum().backward()
        seconds.append(time.perf_counter() - start)
    found["timing"] = {"backend": backend, "first": seconds[0], "later": min(seconds[1:])}
    del model, run
    model = build(Stack, bucket_cap_mb=0.5)  # under the 1 MiB DDPOptimizer assumes at first
    try:
        torch.compile(model, backend=counting)(x)
        found["small_buckets_error"] = None
    except Exception as error:  # noqa: BLE001  whatever dynamo raises, kept for the lesson
        found["small_buckets_error"] = f"{type(error).__name__}: {error}"
    del model
    return found


@record
def main():
    parser = arguments(__doc__)
    parser.add_argument("--backend", default="aot_eager",
                        help="torch.compile backend to time (inductor: slow to compile on CPU)")
    args = parser.parse_args()
    world = setup(args.device, ddp=True)  # ddp=True: lesson 13, "A clean exit"
    report(args.out, compiled(world.rank, world.device, args.backend))
    teardown()


if __name__ == "__main__":
    main()
