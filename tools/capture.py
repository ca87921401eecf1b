"""Helpers for lesson 01's in-kernel demonstration of torch.multiprocessing.spawn."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time


class CapturedText:
    text = ""


@contextlib.contextmanager
def child_stderr():
    """Send file descriptor 2 to a temporary file while the block runs.

    Child processes inherit descriptor 2, so what they print to stderr (normally
    only visible in the Jupyter server's log) ends up in ``captured.text``.
    """
    captured = CapturedText()
    with tempfile.TemporaryFile(mode="w+b") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            captured.text = log.read().decode(errors="replace")


def wait_for(context, timeout: float):
    """Join a ``torch.multiprocessing`` ProcessContext within ``timeout`` seconds.

    Returns the exception that joining raised (a child failed), or None when every
    child finished cleanly. Children still running at the deadline are killed and a
    TimeoutError is returned, so the demonstration can never hang the notebook.
    """
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0.01)):
            if time.monotonic() >= deadline:
                for process in context.processes:
                    process.kill()
                return TimeoutError(f"children still running after {timeout:g} s: killed")
    except Exception as error:  # the children's failure, reported by join()
        return error
    return None
