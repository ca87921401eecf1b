"""Lesson 20's statements about the store's timeouts, checked in this process (no launch).

The lesson measures a 1-second TCPStore timeout firing at 2 s. These tests pin down why:
the store counts the time it waited in whole seconds and gives up once that count is
larger than the timeout, so a fractional timeout fires at the next whole second, not one
second after the timeout. They also check the default timeouts the lesson quotes.
"""

import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

from tools.launch import free_port


@pytest.mark.parametrize("timeout, fires_at", [(0.5, 1), (1.0, 2), (1.5, 2)])
def test_a_world_that_never_fills_times_out_at_the_next_whole_second(timeout, fires_at):
    start = time.monotonic()
    with pytest.raises(dist.DistStoreError) as caught:  # a server waiting for 2, alone
        dist.TCPStore("127.0.0.1", free_port(), world_size=2, is_master=True,
                      timeout=timedelta(seconds=timeout))
    seconds = time.monotonic() - start
    assert (f"Timed out after {fires_at} seconds waiting for clients. 1/2 clients joined"
            in str(caught.value))
    assert fires_at <= seconds < fires_at + 3  # never early; a margin for a loaded machine


def test_the_default_timeouts_the_lesson_quotes():
    assert default_pg_timeout == timedelta(minutes=30)  # init_process_group, non-NCCL
    assert "timeout: datetime.timedelta = datetime.timedelta(seconds=300)" in (
        dist.TCPStore.__init__.__doc__)  # a TCPStore built by hand
    assert RendezvousTimeout().join == timedelta(seconds=600)  # torchrun's agents
