"""A real IPython kernel driven through jupyter_client, for the notebook-side tests.

``KernelSession.run(code)`` sends one execute request (optionally with request
metadata such as JupyterLab's ``cellId``), collects its output until the kernel is
idle again, and returns a :class:`Reply`.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from jupyter_client.manager import KernelManager

M = TypeVar("M", bound=KernelManager)

__all__ = ["KernelDied", "KernelSession", "Reply", "kernel_manager"]


def kernel_manager(kind: type[M]) -> M:
    """A python3 kernel manager (``kind``: ``AsyncKernelManager`` for nbclient) whose kernel
    listens on Unix sockets in a folder of its own.

    Over TCP, jupyter_client picks free ports, lets them go and hands them to the kernel to
    bind; a parallel test's kernel or server can take one in between, and the kernel dies with
    "Address already in use" before it answers. Socket files in a private folder cannot be
    taken. The folder is short (a Unix socket path holds 107 bytes) and goes with the manager.
    """
    folder = tempfile.mkdtemp(prefix="kx-kernel-")
    manager = kind(kernel_name="python3", transport="ipc", ip=os.path.join(folder, "k"))
    weakref.finalize(manager, shutil.rmtree, folder, True)
    return manager


class KernelDied(RuntimeError):
    """The kernel process ended before it answered the request."""


@dataclass
class Reply:
    status: str
    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """stdout plus the text/plain of every result."""
        plain = "\n".join(str(r.get("text/plain", "")) for r in self.results)
        return self.stdout + plain

    def ok(self) -> Reply:
        assert self.status == "ok", f"cell failed: {self.error}\n{self.stdout}{self.stderr}"
        return self


class KernelSession:
    """One kernel process with ``env`` added to this process's environment."""

    def __init__(
        self, env: dict[str, str] | None = None, extra_arguments: list[str] | None = None
    ) -> None:
        self.km = kernel_manager(KernelManager)
        self.km.start_kernel(
            env={**os.environ, **(env or {})}, extra_arguments=list(extra_arguments or [])
        )
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except BaseException:
            self.close()
            raise

    def run(
        self, code: str, *, timeout: float = 60.0, metadata: dict[str, Any] | None = None
    ) -> Reply:
        msg = self.kc.session.msg(
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
            metadata=metadata or {},
        )
        self.kc.shell_channel.send(msg)
        return self.collect(msg["header"]["msg_id"], timeout)

    def collect(self, msg_id: str, timeout: float = 60.0) -> Reply:
        """Outputs of request ``msg_id`` until the kernel is idle, then its reply."""
        reply = Reply(status="?")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no idle status from the kernel within {timeout}s")
            try:
                out = self.kc.get_iopub_msg(timeout=min(left, 1.0))
            except queue.Empty:
                if not self.km.is_alive():
                    raise KernelDied(f"the kernel died before request {msg_id} finished") from None
                continue
            if out["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = out["msg_type"], out["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    reply.stdout += content["text"]
                else:
                    reply.stderr += content["text"]
            elif kind in ("execute_result", "display_data"):
                reply.results.append(content["data"])
            elif kind == "error":
                reply.error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        while True:
            try:
                shell = self.kc.get_shell_msg(timeout=1.0)
            except queue.Empty:
                # A kernel that dies right after going idle may never send its reply.
                if not self.km.is_alive():
                    raise KernelDied(f"the kernel died before replying to {msg_id}") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no reply from the kernel within {timeout}s") from None
                continue
            if shell["parent_header"].get("msg_id") == msg_id:
                reply.status = shell["content"]["status"]
                if reply.error is None and reply.status == "error":
                    reply.error = shell["content"]
                return reply

    def send(self, code: str) -> str:
        """Start ``code`` without waiting; returns the request id (see :meth:`collect`)."""
        return str(self.kc.execute(code))

    def interrupt(self) -> None:
        self.km.interrupt_kernel()

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=True)

    def __enter__(self) -> KernelSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
