"""The notebook server's kernelext route: ``server``, a JupyterLab for one test module
(import ``module_lab_server``), and ``post``, a panel's POST to the route as its buttons send it."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from browser import jupyterlab as lab

from support.shown import shown_by_a_panel


@contextlib.contextmanager
def serving(
    factory: pytest.TempPathFactory, env: Mapping[str, str] | None = None
) -> Iterator[lab.LabServer]:
    """JupyterLab, with kernelext's server extension, serving an empty folder of its own
    (``env`` added to its environment)."""
    root = factory.mktemp("server-root")
    with lab.running_jupyterlab(root, factory.mktemp("jupyter-home"), env) as running:
        yield running


@pytest.fixture(scope="module", name="server")
def module_lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.LabServer]:
    """The fixture ``server``: ``serving``, once for the test module."""
    with serving(tmp_path_factory) as running:
        yield running


def post(
    server: lab.LabServer, path: str, body: Any, *, token: bool = True, shown: bool = True
) -> tuple[int, Any]:
    """POST ``body`` as a panel's buttons do; ``shown``: a panel of the server's user drew
    buttons for the store the body names first (the route opens no other store)."""
    if shown and isinstance(body, dict) and isinstance(body.get("store"), str):
        shown_by_a_panel(server.runtime_dir, body["store"])
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {server.token}"
    request = urllib.request.Request(
        f"{server.url}/kernelext/api/{path}", data=data, method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        try:
            text = error.read()
        finally:
            error.close()  # its connection: its code stays readable
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, text.decode(errors="replace")
