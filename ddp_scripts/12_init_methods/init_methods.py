"""Lesson 12: how processes find each other, five ways.

Each rank reads RANK and WORLD_SIZE from its environment (torchrun sets them; so can
any other launcher) and joins the process group with each method given, in turn:

  env        init_method="env://"           MASTER_ADDR:MASTER_PORT from the environment
  tcp        init_method="tcp://ADDR:PORT"  rank 0 listens on PORT, the others connect
                                            (under torchrun every rank is a client, so
                                            nobody listens on PORT: lesson 20)
  file       init_method="file://PATH"      the ranks meet in a file they can all reach
  tcpstore   store=TCPStore(ADDR, PORT)     what tcp:// does, with the store made by hand
  filestore  store=FileStore(PATH)          what file:// does, by hand

After joining, the ranks check the world they formed, then leave it. With --keep-going a
failed method is recorded and the next one tried. Rank 0 writes every attempt to --out.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/12_init_methods/init_methods.py \\
        --methods env
    RANK=0 WORLD_SIZE=2 python ddp_scripts/12_init_methods/init_methods.py \\
        --methods tcp --port 29511 &
    RANK=1 WORLD_SIZE=2 python ddp_scripts/12_init_methods/init_methods.py \\
        --methods tcp --port 29511
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from ddp_common import arguments, record, report, write_json

METHODS = ["env", "tcp", "file", "tcpstore", "filestore"]


def join(method, args, rank, world_size, backend):
    """Join the default process group with one init method: the lesson's table in code."""
    seconds = args.tcp_timeout if method == "tcp" and args.tcp_timeout else args.timeout
    timeout = datetime.timedelta(seconds=seconds)
    if method == "env":
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    elif method == "tcp":
        dist.init_process_group(backend, init_method=f"tcp://{args.addr}:{args.port}",
                                rank=rank, world_size=world_size, timeout=timeout)
    elif method == "file":
        dist.init_process_group(backend, init_method=f"file://{args.file}",
                                rank=rank, world_size=world_size, timeout=timeout)
    elif method == "tcpstore":
        store = dist.TCPStore(args.addr, args.store_port, world_size,
                              is_master=(rank == 0), timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    elif method == "filestore":
        store = dist.FileStore(args.file + ".store", world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)


def check_world(rank, device):
    """An all_reduce of ones counts the members; every rank reports who it is."""
    ones = torch.ones(1, device=device)
    dist.all_reduce(ones)
    me = {"rank": rank, "local_rank": os.environ.get("LOCAL_RANK"),
          "node": os.environ.get("GROUP_RANK"), "pid": os.getpid(),
          "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
          "master": f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"}
    return {"world_size": dist.get_world_size(), "sum_of_ones": ones.item(),
            "members": report(None, me)}  # every rank's `me`, on every rank


def options():
    parser = arguments(__doc__)  # --device and --out (lesson 02)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=["env"])
    parser.add_argument("--addr", default="127.0.0.1", help="rank 0's address (tcp, tcpstore)")
    parser.add_argument("--port", type=int, help="port for tcp://")
    parser.add_argument("--store-port", type=int, help="port for the TCPStore")
    parser.add_argument("--file", help="rendezvous file for file:// (FileStore adds .store)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds to wait for the others before giving up")
    parser.add_argument("--tcp-timeout", type=float,
                        help="a timeout for tcp:// alone (default: --timeout)")
    parser.add_argument("--crash-after-joining", action="store_true",
                        help="exit at once after joining, without leaving the group")
    parser.add_argument("--keep-going", action="store_true",
                        help="record a method that fails and go on with the next")
    parser.add_argument("--backend", default="auto", help="auto: gloo on CPU, nccl on GPU")
    args = parser.parse_args()
    for method, needs in [("tcp", "port"), ("tcpstore", "store_port"), ("file", "file"),
                          ("filestore", "file")]:
        if method in args.methods and getattr(args, needs) is None:
            parser.error(f"--methods {method} needs --{needs.replace('_', '-')}")
    return args


def pick_device(choice, local_rank):
    """cuda:LOCAL_RANK when GPUs are wanted (auto: visible), otherwise the CPU (lesson 02)."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@record
def main():
    args = options()
    missing = [name for name in ("RANK", "WORLD_SIZE") if name not in os.environ]
    if missing:  # who this process is: a launcher must say it
        sys.exit(f"{sys.argv[0]}: {', '.join(missing)} not set. This script is one rank of a "
                 f"distributed job: start it with torchrun, for example\n  torchrun "
                 f"--standalone --nproc-per-node=2 {sys.argv[0]}\nor set RANK and "
                 f"WORLD_SIZE yourself for each process.")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", "0")))
    backend = (dist.get_default_backend_for_device(device) if args.backend == "auto"
               else args.backend)
    attempts = []
    for method in args.methods:
        start = time.monotonic()
        try:
            join(method, args, rank, world_size, backend)
        except Exception as error:  # noqa: BLE001 - every failure is the lesson here
            seconds = time.monotonic() - start
            message = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
            print(f"{method}: failed after {seconds:.1f} s: {message}", flush=True)
            attempts.append({"method": method, "ok": False, "seconds": seconds, "error": message})
            if not args.keep_going:
                sys.exit(1)
            continue
        if args.crash_after_joining:
            print(f"{method}: joined, now crashing on purpose", flush=True)
            os._exit(1)  # no clean-up of any kind, like a SIGKILL
        attempts.append({"method": method, "ok": True, "seconds": time.monotonic() - start,
                         **check_world(rank, device)})
        if rank == 0:
            print(f"{method}: {world_size} ranks joined in {attempts[-1]['seconds']:.2f} s",
                  flush=True)
        dist.destroy_process_group()  # the next method starts from no group at all
    if rank == 0 and args.out:  # no group is left: rank 0 writes what it saw
        write_json(args.out, {"world_size": world_size, "attempts": attempts})


if __name__ == "__main__":
    main()
