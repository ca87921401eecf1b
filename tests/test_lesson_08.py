"""Lesson 08 in practice: its statement of versions with the store trap, on the installed torch.

Older torchrun gave the workers of each attempt keys of their own in the agent's store
(a PrefixStore named after TORCHELASTIC_RESTART_COUNT); the lesson says that prefix is
gone from torch 2.6 on. This test fails if the installed torch brings it back, so the
lesson's explanation of the trap (and its need for a fix) would have to change.
"""

from datetime import timedelta

import torch.distributed as dist
from torch.distributed.rendezvous import _create_c10d_store


def test_workers_use_the_agents_store_without_a_prefix_per_restart(monkeypatch):
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # as torchrun sets them
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    worker = _create_c10d_store("127.0.0.1", agent.port, rank=0, world_size=2,
                                timeout=timedelta(seconds=10))
    assert type(worker) is dist.TCPStore  # a plain client, even for rank 0: no PrefixStore
    worker.set("default_pg/0//cpu//0/0", "address of rank 0")
    assert agent.list_keys() == ["default_pg/0//cpu//0/0"]  # the name every attempt uses
