"""Lesson 32: the course's DDP training, run on a cluster of two hosts.

Each rank says where it runs (host name, node, the addresses of its TCP connections to the
other ranks, read from /proc), then the ranks train lesson 03's network on the digits.

    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=nodeA:29500 \\
        --rdzv-id=job1 ddp_scripts/32_clusters/clusters.py          # the same on every node

Under Slurm's srun without torchrun, start ddp_scripts/32_clusters/from_slurm.py instead: it maps
Slurm's variables to torch's, then runs this training.
"""

import os
import socket

from ddp_common import arguments, record, report, setup, teardown
from digits_data import train  # lesson 03's training loop (ddp_scripts/shared/)


def address(hex_address):
    """'0100007F:1F90' (from /proc/net/tcp) -> '127.0.0.1:8080'; IPv4 inside IPv6 too."""
    ip, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(ip[i:i + 8])[::-1] for i in range(0, len(ip), 8))
    text = socket.inet_ntoa(raw[-4:]) if len(raw) == 4 or raw[:12] == bytes(10) + b"\xff\xff" \
        else socket.inet_ntop(socket.AF_INET6, raw)
    return f"{text}:{int(port, 16)}"


def connections():
    """This process's established TCP connections, as 'local -> remote'."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            mine.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and f"socket:[{fields[9]}]" in mine:  # 01: established
                found.append(f"{address(fields[1])} -> {address(fields[2])}")
    return sorted(found)


@record
def main(set_variables=None):
    """set_variables: for a launcher other than torchrun, sets torch's variables from
    its own (from_slurm.py), once the options are read."""
    parser = arguments(__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30,
                        help="seconds a collective waits before it fails")
    args = parser.parse_args()
    if set_variables:
        set_variables()
    world = setup(args.device, timeout_s=args.timeout, ddp=True)
    trained = train(world.rank, world.world_size, world.device, args, world.rank == 0)
    report(args.out, {"rank": world.rank, "local_rank": world.local_rank,
                      "node": int(os.environ["GROUP_RANK"]), "host": socket.gethostname(),
                      "by_slurm": set_variables is not None,
                      "slurm_job": os.environ.get("SLURM_JOB_ID"),
                      "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                      "connections": connections(), "weights_sum": sum(trained["weights"])},
           history=trained["history"])
    teardown()


if __name__ == "__main__":
    main()
