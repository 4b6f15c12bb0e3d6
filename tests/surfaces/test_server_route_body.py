"""The route reads no more of a click's body than ``MAX_BODY``: a body announced larger is
refused before it is read, over a real socket to a real Jupyter server, and the server
answers the next click as before."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from browser import jupyterlab as lab
from support.route import module_lab_server, post  # noqa: F401  (the fixture `server`)

import kernelext as kx
from kernelext._server.handlers import MAX_BODY

pytestmark = [pytest.mark.slow]


def _send_head(server: lab.LabServer, length: int, *, token: bool = True) -> socket.socket:
    host, port = server.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    auth = f"Authorization: token {server.token}\r\n" if token else ""
    head = (
        "POST /kernelext/api/stop HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n{auth}"
        "Content-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode() + b"{" + b" " * 4096)  # the start of a body, never all of it
    return sock


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data or b"}" not in data.split(b"\r\n\r\n", 1)[1]:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_body_announced_over_the_limit_is_refused_before_it_is_read(
    server: lab.LabServer, tmp_path: Path
) -> None:
    sock = _send_head(server, 200 * 1024 * 1024)
    try:
        answer = _answer(sock)  # answered although only 4 KiB of 200 MB were sent
    finally:
        sock.close()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"413", answer[:500]
    assert b"larger than 64 KiB" in rest and b'"route": "kernelext"' in rest, rest[:500]
    path = str(tmp_path / "runs.duckdb")
    kx.open_store(path).close()
    status, body = post(server, "stop", {"run_id": "no-such-run", "store": path})
    assert status == 404 and "no-such-run" in body["message"], body  # the next click


def test_a_body_over_the_limit_in_full_gets_the_clear_refusal(server: lab.LabServer) -> None:
    status, body = post(server, "stop", b'{"run_id": "r", "store": "' + b"x" * MAX_BODY + b'"}')
    assert status == 413 and "larger than 64 KiB" in body["message"], body


def test_an_unknown_client_is_refused_before_its_body_counts(server: lab.LabServer) -> None:
    sock = _send_head(server, 200 * 1024 * 1024, token=False)
    try:
        answer = _answer(sock)
    finally:
        sock.close()
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"403", answer[:300]
