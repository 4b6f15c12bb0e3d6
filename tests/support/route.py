"""A panel's POST to the notebook server's kernelext route, as its buttons send it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from browser import jupyterlab as lab

from support.shown import shown_by_a_panel


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
        text = error.read()
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, text.decode(errors="replace")
