"""One JupyterLab server for all the browser tests of a pytest process, each test meeting it
as a server of its own would be.

The server serves pytest's base temporary folder, so that a test's notebook folder
(``tmp_path / "root"``) is in its tree. Before each test:

- the Lab user settings and workspaces are put back as a new Jupyter home has them (a
  theme picked by an earlier test, or the tabs it left open, are gone);
- the notes of the stores earlier kernels showed (what the kernelext route of the server
  may open) are removed;
- the ``python3`` kernelspec the server finds first (a copy of the venv's, in a folder
  ahead of Jupyter's own) is written with the test's environment: ``env``, and what this
  process's environment holds now that it did not hold when the server started (e.g. the
  ``KERNELEXT_STORE`` of ``store_path``). Every kernel the test starts gets what a server
  started for it would have passed on.

After the test its sessions and kernels are shut down through the API, and a kernel that
outlived that is killed, as when the server of the test stopped.

A test whose folder is not under the served one, or that removed a variable from this
process's environment since the server started, gets a server of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from browser import jupyterlab as lab

KERNEL_NAME = "python3"  # the kernelspec every notebook of the tests names
KERNEL_GONE_SECONDS = 10.0
# The shared server's config (Python, next to the JSON one every test server has): the
# test's kernelspecs are looked for first, then where Jupyter looks, in the same order.
KERNELSPECS_FIRST = """from jupyter_client.kernelspec import KernelSpecManager


class TestKernelSpecsFirst(KernelSpecManager):
    def _kernel_dirs_default(self):
        return [{folder!r}, *super()._kernel_dirs_default()]


c.ServerApp.kernel_spec_manager_class = TestKernelSpecsFirst
"""


def _venv_kernelspec() -> Path:
    return Path(sys.prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME


class SharedLab:
    """The server, started when a test first asks for it; ``close`` stops it."""

    def __init__(self, served: Path, home: Path, base_env: Mapping[str, str]) -> None:
        self.served, self.home, self.base_env = served, home, dict(base_env)
        self._stack = contextlib.ExitStack()
        self._server: lab.LabServer | None = None
        self._spec_dir = home / "test-kernelspecs" / KERNEL_NAME
        self._not_kernels: set[int] = set()  # the server's children before any kernel

    def close(self) -> None:
        self._stack.close()
        self._server = None

    def _started(self) -> lab.LabServer:
        if self._server is None or self._server.process.poll() is not None:
            self.close()
            config = self.home / lab.HOME_DIRS["JUPYTER_CONFIG_DIR"] / "jupyter_server_config.py"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(KERNELSPECS_FIRST.format(folder=str(self._spec_dir.parent)))
            running = lab.running_jupyterlab(self.served, self.home, base_env=self.base_env)
            self._server = self._stack.enter_context(running)
            self._not_kernels = set(lab.child_pids(self._server.process.pid))
        return self._server

    def _kernel_env(self, env: Mapping[str, str]) -> dict[str, str] | None:
        """What the test's kernels get on top of the server's environment; None when the
        test removed a variable the server has (a kernelspec cannot unset one)."""
        if any(name not in os.environ for name in self.base_env):
            return None
        changed = {k: v for k, v in os.environ.items() if self.base_env.get(k) != v}
        # kernelspec values are templates ($NAME is substituted): a "$" stays a "$"
        return {k: v.replace("$", "$$") for k, v in {**changed, **env}.items()}

    @contextlib.contextmanager
    def serving(self, root: Path, env: Mapping[str, str]) -> Iterator[lab.LabServer]:
        """A server for ``root`` whose kernels get ``env``: the shared one when it can be."""
        kernel_env = self._kernel_env(env)
        if kernel_env is None or not root.resolve().is_relative_to(self.served.resolve()):
            with lab.running_jupyterlab(root, root.parent / "jupyter-home", env) as own:
                yield own
            return
        server = self._started()
        end_kernels(server, self._not_kernels)  # one a page started as it closed, if any
        self._fresh_home(kernel_env)
        folder = root.resolve().relative_to(self.served.resolve()).as_posix()
        try:
            yield replace(server, root_dir=root, folder=folder)
        finally:
            end_kernels(server, self._not_kernels)

    def _fresh_home(self, kernel_env: Mapping[str, str]) -> None:
        for name in ("JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
            shutil.rmtree(self.home / lab.HOME_DIRS[name], ignore_errors=True)
        lab.isolated_home(self.home)  # the settings and folders of a new home
        runtime = lab.runtime_dir(self.home)
        for note in runtime.glob("kernelext-shown-*"):  # the stores earlier kernels showed
            note.unlink(missing_ok=True)
        spec_dir = self._spec_dir
        shutil.rmtree(spec_dir, ignore_errors=True)
        shutil.copytree(_venv_kernelspec(), spec_dir)
        spec = json.loads((spec_dir / "kernel.json").read_text(encoding="utf-8"))
        spec["env"] = dict(kernel_env)
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")


def end_kernels(server: lab.LabServer, not_kernels: set[int]) -> None:
    """Shut every session and kernel down through the API; SIGKILL any kernel (a child of
    the server not in ``not_kernels``) still alive after that."""
    with contextlib.suppress(OSError, ValueError):
        for session in server.api("/api/sessions"):
            with contextlib.suppress(OSError, ValueError):
                server.api(f"/api/sessions/{session['id']}", method="DELETE", timeout=20.0)
    with contextlib.suppress(OSError, ValueError):
        for kernel in server.api("/api/kernels"):
            with contextlib.suppress(OSError, ValueError):
                server.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)
    left = [pid for pid in lab.child_pids(server.process.pid) if pid not in not_kernels]
    for pid in left:
        if lab.is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KERNEL_GONE_SECONDS
    while any(lab.is_alive(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)


_IN_USE: list[SharedLab] = []


@contextlib.contextmanager
def sharing(served: Path, home: Path) -> Iterator[SharedLab]:
    """While inside, ``server_for`` gives the tests the server of a ``SharedLab`` serving
    ``served`` (its Jupyter home in ``home``; its environment this process's, now)."""
    shared = SharedLab(served, home, os.environ)
    _IN_USE.append(shared)
    try:
        yield shared
    finally:
        _IN_USE.remove(shared)
        shared.close()


@contextlib.contextmanager
def server_for(root: Path, env: Mapping[str, str]) -> Iterator[lab.LabServer]:
    """A server for the notebooks in ``root`` whose kernels get ``env``: the shared one
    while ``sharing``, else one started for the caller (its home next to ``root``)."""
    if _IN_USE:
        with _IN_USE[-1].serving(root, env) as server:
            yield server
    else:
        with lab.running_jupyterlab(root, root.parent / "jupyter-home", env) as own:
            yield own
