"""A notebook kernel started warm, for `make course` and `make test` (papermill).

Every lesson runs in a new kernel, which imports ipykernel's machinery (IPython, zmq,
tornado) as it starts, and torch for the lesson's checks: a few seconds per lesson on 2
cores. `WarmKernelManager` starts the kernel as jupyter_client would (the same command,
environment, folder, and JPY_PARENT_PID), but forked from a server that has made those
imports (tools/zygote.py, `start_kernel`, KERNEL_PRELOAD): the kernel is then the process
`python -m ipykernel_launcher ...` would have started, as a warm worker is the process
`python -u SCRIPT` would have. Where no warm kernel can be had (not Linux,
DDP_COURSE_COLD_LAUNCH=1, no C compiler), it starts the kernel as usual. JupyterLab
(`make lab`) starts its kernels as usual.
"""

from __future__ import annotations

import os

from jupyter_client.manager import AsyncKernelManager

from tools import zygote


class WarmKernelManager(AsyncKernelManager):
    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        env = dict(kw.get("env") or os.environ)
        env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launch_kernel sets it
        process = zygote.start_kernel(list(kernel_cmd), env, kw.get("cwd") or os.getcwd())
        if process is None:
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        provisioner = self.provisioner
        provisioner.process, provisioner.pid, provisioner.pgid = process, process.pid, process.pid
        provisioner.cwd = kw.get("cwd")
        self._reconcile_connection_info(provisioner.connection_info)
