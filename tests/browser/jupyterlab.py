"""A real JupyterLab on 127.0.0.1, and the moves a user makes in it.

``running_jupyterlab`` starts ``jupyter lab`` from the project's venv with a random
port and token, an isolated Jupyter home (config, data, runtime, lab settings and
workspaces in a temp folder, so a developer's own setup cannot leak in) and no
outgoing requests (news, update checks, extension manager). Extra environment
variables (``KERNELEXT_STORE``) reach every kernel the server starts.

The page helpers below do what a user does in Chromium (browser/chromium.py): open a
notebook, wait for the kernel, select a cell and press Ctrl+Enter, type a new cell.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from browser.lab_tab import opened_in_place

JUPYTER = Path(sys.executable).with_name("jupyter")
STARTUP_TIMEOUT = 90.0
WAIT_MS = 60_000  # Playwright timeouts: generous, a 2-core CI machine is slow

# Lab user settings: no news/update toasts, and every cell kept in the DOM.
LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
SERVER_CONFIG: dict[str, Any] = {
    "LabApp": {
        "news_url": None,
        "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate",
        "extension_manager": "readonly",
        "expose_app_in_browser": True,  # window.jupyterapp: a tab is reused (browser/lab_tab.py)
    },
    "ServerApp": {"jpserver_extensions": {"jupyter_lsp": False}},
}


# -- JupyterLab server --------------------------------------------------------


@dataclass
class LabServer:
    url: str
    token: str
    root_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    runtime_dir: Path  # JUPYTER_RUNTIME_DIR of the server and of every kernel it starts
    folder: str = ""  # where ``root_dir`` is in the server's tree ("": its top)

    def path_of(self, name: str) -> str:
        """``name`` (relative to ``root_dir``) as the server's URLs and API name it."""
        return f"{self.folder}/{name}" if self.folder else name

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{quote(self.path_of(name))}?token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 10.0) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:])


def copy_notebook(source: Path, root_dir: Path, name: str | None = None) -> str:
    """Copy ``source`` into ``root_dir`` with outputs and execution counts cleared."""
    notebook = json.loads(source.read_text(encoding="utf-8"))
    for item in notebook["cells"]:
        if item["cell_type"] == "code":
            item["outputs"] = []
            item["execution_count"] = None
    notebook.get("metadata", {}).pop("widgets", None)
    target = name or source.name
    (root_dir / target).write_text(json.dumps(notebook, indent=1), encoding="utf-8")
    return target


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


HOME_DIRS = {  # the variables of an isolated Jupyter home, and their folders in it
    "JUPYTER_CONFIG_DIR": "config",
    "JUPYTER_DATA_DIR": "data",
    "JUPYTERLAB_SETTINGS_DIR": "lab-settings",
    "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces",
    "IPYTHONDIR": "ipython",
}


def runtime_dir(home: Path) -> Path:
    """The Jupyter runtime folder of ``home``: short, outside it, because the kernels listen
    on Unix sockets there (``KernelManager.transport=ipc``: a TCP port picked free can be
    taken by a parallel test before the kernel binds it) and a socket path holds 107 bytes."""
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"kx-runtime-{digest}"


def isolated_home(home: Path) -> dict[str, str]:
    """The folders of a Jupyter home in ``home`` (made, with the server config and the Lab
    user settings written); the variables that point a server at them."""
    dirs = {name: home / folder for name, folder in HOME_DIRS.items()}
    dirs["JUPYTER_RUNTIME_DIR"] = runtime_dir(home)
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    (dirs["JUPYTER_CONFIG_DIR"] / "jupyter_server_config.json").write_text(
        json.dumps(SERVER_CONFIG, indent=2), encoding="utf-8"
    )
    for relative, values in LAB_SETTINGS.items():
        path = dirs["JUPYTERLAB_SETTINGS_DIR"] / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")
    return {name: str(path) for name, path in dirs.items()}


def _start_once(
    root_dir: Path,
    home: Path,
    env: Mapping[str, str],
    attempt: int,
    base: Mapping[str, str],
) -> LabServer:
    port, token = _free_port(), secrets.token_hex(16)
    log_path = home / f"jupyterlab-{attempt}.log"
    command = [
        str(JUPYTER),
        "lab",
        "--no-browser",
        "--ServerApp.open_browser=False",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.terminals_enabled=False",
        "--KernelManager.transport=ipc",  # see runtime_dir
    ]
    if os.geteuid() == 0:  # containers and CI often run as root
        command.append("--ServerApp.allow_root=True")
    full_env = {**base, **isolated_home(home), **env, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=root_dir
        )
    runtime_dir = Path(full_env["JUPYTER_RUNTIME_DIR"])
    return LabServer(f"http://127.0.0.1:{port}", token, root_dir, process, log_path, runtime_dir)


def _wait_ready(server: LabServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"jupyter lab exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        with contextlib.suppress(OSError, ValueError):
            if server.api("/api/status", timeout=2.0).get("started"):
                return
        time.sleep(0.2)
    raise TimeoutError(f"jupyter lab not ready after {timeout:.0f}s:\n{server.log_tail()}")


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_jupyterlab(server: LabServer) -> None:
    """Shut kernels down through the API, then SIGTERM the server; SIGKILL leftovers."""
    with contextlib.suppress(OSError, ValueError):
        for kernel in server.api("/api/kernels"):
            with contextlib.suppress(OSError, ValueError):
                server.api(f"/api/kernels/{kernel['id']}", method="DELETE", timeout=20.0)
    kernels = child_pids(server.process.pid)
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)
    for pid in kernels:
        if is_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_jupyterlab(
    root_dir: Path,
    home: Path,
    env: Mapping[str, str] | None = None,
    attempts: int = 3,
    base_env: Mapping[str, str] | None = None,
) -> Iterator[LabServer]:
    """JupyterLab serving ``root_dir``; retried only while starting (e.g. a port race).
    Its environment: ``base_env`` (default: this process's), the isolated home, ``env``."""
    errors: list[str] = []
    for attempt in range(1, attempts + 1):
        server = _start_once(root_dir, home, env or {}, attempt, base_env or os.environ)
        try:
            _wait_ready(server, STARTUP_TIMEOUT)
        except (RuntimeError, TimeoutError) as exc:
            stop_jupyterlab(server)
            errors.append(str(exc))
            if "already in use" in str(exc).lower():  # lost a port race: try another port
                continue
            break
        try:
            yield server
        finally:
            stop_jupyterlab(server)
            shutil.rmtree(server.runtime_dir, ignore_errors=True)
        return
    raise RuntimeError("JupyterLab did not start:\n\n" + "\n\n".join(errors))


# -- JupyterLab page helpers ----------------------------------------------------

NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
KERNEL_IDLE = re.compile(r"^(?!No Kernel).+ \| Idle$")
OPEN_MS = 120_000  # loading JupyterLab's bundles is the slow part on a busy 2-core machine
PROMPT_NOT_RUN = re.compile(r"^\[ \]:$")  # a code cell never run since the page opened
PROMPT_DONE = re.compile(r"^\[\d+\]:$")
ERROR_MARK = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b", re.M)


def open_notebook(page: Any, server: LabServer, name: str) -> None:
    """Open ``name`` and wait until all its cells are shown and its kernel is idle."""
    from playwright.sync_api import expect

    notebook = json.loads((server.root_dir / name).read_text(encoding="utf-8"))
    if not opened_in_place(page, server, name):  # the tab the previous test put away
        page.goto(server.notebook_url(name), wait_until="domcontentloaded")
    wait_kernel_idle(page, OPEN_MS)
    expect(cells(page)).to_have_count(len(notebook["cells"]), timeout=OPEN_MS)


def open_notebook_7(page: Any, server: LabServer, name: str) -> None:
    """Open ``name`` in Notebook 7's interface (``/notebooks/...``); wait as for Lab."""
    from playwright.sync_api import expect

    notebook = json.loads((server.root_dir / name).read_text(encoding="utf-8"))
    page.goto(f"{server.url}/notebooks/{quote(server.path_of(name))}?token={server.token}")
    idle = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first
    idle.wait_for(state="attached", timeout=OPEN_MS)
    expect(cells(page)).to_have_count(len(notebook["cells"]), timeout=OPEN_MS)


def wait_kernel_idle(page: Any, timeout_ms: int = WAIT_MS) -> None:
    """The status bar says "<kernel name> | Idle" (the toolbar dot is idle before any kernel)."""
    status = page.locator("#jp-main-statusbar").get_by_text(KERNEL_IDLE)
    status.wait_for(timeout=timeout_ms)


def cells(page: Any) -> Any:
    return page.locator(f"{NOTEBOOK} .jp-WindowedPanel-viewport > .jp-Cell")


def cell(page: Any, index: int) -> Any:
    return cells(page).nth(index)


def select_cell(page: Any, index: int) -> Any:
    """Click the cell's prompt (selects it, command mode) and return its locator."""
    target = cell(page, index)
    target.scroll_into_view_if_needed()
    target.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    return target


def run_cell(page: Any, index: int, timeout_ms: int = WAIT_MS) -> Any:
    """Select cell ``index``, press Ctrl+Enter (run in place), wait until it ran.

    Fails at once with the traceback text when the cell raised.
    """
    from playwright.sync_api import expect

    target = select_cell(page, index)
    page.keyboard.press("Control+Enter")
    if "jp-CodeCell" in (target.get_attribute("class") or ""):
        # A key press before the page is ready for it is lost: the cell is neither queued
        # ([*]) nor run, so pressing again cannot run it twice.
        for _ in range(3):
            try:
                expect(target.locator(".jp-InputPrompt")).not_to_have_text(
                    PROMPT_NOT_RUN, timeout=10_000
                )
                break
            except AssertionError:
                select_cell(page, index)
                page.keyboard.press("Control+Enter")
    return wait_cell_done(target, timeout_ms)


def wait_cell_done(target: Any, timeout_ms: int = WAIT_MS) -> Any:
    from playwright.sync_api import expect

    if "jp-CodeCell" not in (target.get_attribute("class") or ""):
        return target
    expect(target.locator(".jp-InputPrompt")).to_have_text(PROMPT_DONE, timeout=timeout_ms)
    errors = target.locator(".jp-OutputArea-output[data-mime-type*='stderr']")
    for i in range(errors.count()):
        text = errors.nth(i).inner_text()
        if ERROR_MARK.search(text):
            raise AssertionError(f"cell failed in the browser:\n{text[-3000:]}")
    return target


def add_cell_at_end(page: Any, source: str, timeout_ms: int = WAIT_MS) -> Any:
    """Append a code cell (typed into the editor, as a user would) and run it."""
    last = cells(page).count() - 1
    select_cell(page, last)
    page.keyboard.press("b")
    new = cell(page, last + 1)
    new.wait_for()
    new.locator(".cm-content").click()
    page.keyboard.insert_text(source)
    page.keyboard.press("Control+Enter")
    return wait_cell_done(new, timeout_ms)


def button(scope: Any, label: str) -> Any:
    """The button labelled exactly ``label`` (an icon's CSS glyph is not part of the label)."""
    return scope.locator("button").filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))


def cell_source(page: Any, index: int) -> str:
    return str(cell(page, index).locator(".jp-InputArea-editor .cm-content").inner_text())


def output_text(target: Any) -> str:
    return str(target.locator(".jp-OutputArea").inner_text())
