"""The route opens only the stores a notebook of its user showed (``shown_stores``).

A click's body can be written by whatever controls a widget's state (a shared notebook's
saved state, drawn again in another person's browser). A real Jupyter server whose process
holds the team's PostgreSQL password (``PGPASSWORD``), a fake PostgreSQL server on
127.0.0.1 that asks for a cleartext password and records every connection and every byte,
real DuckDB files and a real PostgreSQL server: an address no panel showed is refused
before anything is opened or connected to; once a panel drew buttons for a store (in this
process, with the server's runtime folder, as a kernel of that server does), clicks on it
work.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import jupyterlab as lab
from hypothesis import given, settings
from hypothesis import strategies as st
from support.route import post, serving
from support.shown import runtime_dir_of, shown_by_a_panel

import kernelext as kx
from kernelext._core.process import shown_stores

pytestmark = [pytest.mark.slow, pytest.mark.both_backends]

TEAM_PASSWORD = "team-store-password-123"
REFUSED = "Open the run's panel again in a notebook of this server"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.LabServer]:
    with serving(tmp_path_factory, {"PGPASSWORD": TEAM_PASSWORD}) as running:
        yield running


class FakePostgres:
    """A TCP port that speaks PostgreSQL's first messages: it declines SSL, asks for a
    cleartext password, and records each connection and everything sent to it."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self.connections = 0
        self.received = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _peer = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self._talk(conn)

    def _talk(self, conn: socket.socket) -> None:
        while True:  # SSLRequest / GSSENCRequest: declined, then the startup message
            message = self._read(conn, self._length(conn) - 4)
            if message[:4] in (b"\x04\xd2\x16\x2f", b"\x04\xd2\x16\x30"):
                conn.sendall(b"N")
                continue
            break
        conn.sendall(b"R" + (8).to_bytes(4, "big") + (3).to_bytes(4, "big"))
        self._read(conn, 1)  # 'p': the password message
        self._read(conn, self._length(conn) - 4)
        error = b"SFATAL\x00C28P01\x00Mfake server\x00\x00"
        conn.sendall(b"E" + (len(error) + 4).to_bytes(4, "big") + error)

    def _length(self, conn: socket.socket) -> int:
        return int.from_bytes(self._read(conn, 4), "big")

    def _read(self, conn: socket.socket, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        self.received += data
        return data

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


@pytest.fixture
def fake_postgres() -> Iterator[FakePostgres]:
    fake = FakePostgres()
    yield fake
    fake.close()


@pytest.mark.duckdb_only
def test_a_host_no_panel_showed_is_never_connected_to(
    server: lab.LabServer, fake_postgres: FakePostgres
) -> None:
    """The server's own password never leaves for a host named only by a click's body."""
    port = fake_postgres.port
    shown = f"postgresql://kx@127.0.0.1:{port}/teamdb"
    crafted = [
        f"postgresql://kx@127.0.0.1:{port}/db",
        f"postgresql://kx@localhost:{port}/teamdb",
        f"postgresql://other@127.0.0.1:{port}/teamdb",
        f"postgresql://kx@127.0.0.1:{port}/teamdb?hostaddr=127.0.0.1&host=elsewhere.example",
        f"postgresql://kx@127.0.0.1:{port}/teamdb?sslmode=disable",
        f"postgresql://kx@127.0.0.1/teamdb?port={port}&dbname=db",
    ]
    shown_by_a_panel(server.runtime_dir, shown)  # the panel showed another database only
    for address in crafted:
        status, answer = post(server, "stop", {"run_id": "r", "store": address}, shown=False)
        assert status == 400 and REFUSED in answer["message"], (address, answer)
    assert fake_postgres.connections == 0 and TEAM_PASSWORD.encode() not in fake_postgres.received
    status, answer = post(server, "stop", {"run_id": "r", "store": shown}, shown=False)
    assert status == 503, answer  # the store a panel showed: the server does connect there
    assert fake_postgres.connections >= 1


def _live_run(address: str, run_id: str) -> None:
    from kernelext._store import actor

    store = kx.open_store(address)
    try:
        assert store.create_run(run_id, "agent", owner=actor())
    finally:
        store.close()


def _stop_requests(address: str, run_id: str) -> list[Any]:
    store = kx.open_store(address)
    try:
        return [e for e in store.events(run_id) if e["kind"] == "stop_requested"]
    finally:
        store.close()


@pytest.mark.duckdb_only
def test_a_duckdb_store_no_panel_showed_is_refused_and_left_as_it_was(
    server: lab.LabServer, tmp_path: Path
) -> None:
    address = str(tmp_path / "someone-elses" / "store.duckdb")
    _live_run(address, "theirs")
    roundabout = str(tmp_path / "someone-elses" / ".." / "someone-elses" / "store.duckdb")
    for named in (address, roundabout):
        status, answer = post(server, "stop", {"run_id": "theirs", "store": named}, shown=False)
        assert status == 400 and REFUSED in answer["message"], answer
    missing = str(tmp_path / "nowhere" / "store.duckdb")
    status, answer = post(server, "stop", {"run_id": "r", "store": missing}, shown=False)
    assert status == 400 and REFUSED in answer["message"]  # says nothing of which files exist
    assert _stop_requests(address, "theirs") == []
    shown_by_a_panel(server.runtime_dir, address)
    status, answer = post(server, "stop", {"run_id": "theirs", "store": address}, shown=False)
    assert status == 200 and answer["recorded"], answer
    assert len(_stop_requests(address, "theirs")) == 1


def test_a_click_on_a_store_works_once_a_kernel_drew_its_panel(
    server: lab.LabServer, store: Any
) -> None:
    """A run's panel drawn in this process (Jupyter's runtime folder: the server's, as in
    any kernel the server starts): before it, a click on the store is refused; after it,
    the same click stops the run."""
    from kernelext._core.lifecycle.from_elsewhere import store_address
    from kernelext.widgets import panel_for

    release = threading.Event()

    @kx.agent(name="shown-run")
    def looping(run: kx.Run) -> None:
        for _ in run.steps(range(400), key=str):
            release.wait(0.05)

    handle = looping.start(run_id="shown-run")
    body = {"run_id": "shown-run", "store": store_address(store)}
    status, answer = post(server, "stop", body, shown=False)
    assert status == 400 and REFUSED in answer["message"], answer
    assert [e for e in store.events("shown-run") if e["kind"] == "stop_requested"] == []
    with runtime_dir_of(server.runtime_dir):
        panel = panel_for(handle)
    assert panel.remote.store == body["store"]
    status, answer = post(server, "stop", body, shown=False)
    assert status == 200 and answer["status"] == "stopping", answer
    assert handle.wait(60) == "suspended"
    assert handle.info()["stop_source"] == "panel"


# -- the list itself: what counts as the same store, and what the file holds ---------------

_PART = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
_OPTIONS = st.fixed_dictionaries(
    {
        "host": st.sampled_from(["127.0.0.1", "db.example", "10.0.0.5"]),
        "port": st.sampled_from(["5432", "6543", ""]),
        "dbname": _PART,
        "user": _PART,
        "sslmode": st.sampled_from(["", "require", "disable"]),
        "hostaddr": st.sampled_from(["", "10.9.9.9"]),
    }
)


def _address(options: dict[str, str], extra: str = "") -> str:
    port = f":{options['port']}" if options["port"] else ""
    query = [f"{k}={options[k]}" for k in ("sslmode", "hostaddr") if options[k]]
    query += [extra] if extra else []
    tail = f"?{'&'.join(query)}" if query else ""
    return f"postgresql://{options['user']}@{options['host']}{port}/{options['dbname']}{tail}"


@pytest.mark.duckdb_only
@settings(max_examples=80, deadline=None)
@given(shown=_OPTIONS, clicked=_OPTIONS, password=_PART)
def test_an_address_is_the_shown_store_exactly_when_it_connects_there_the_same_way(
    tmp_path_factory: pytest.TempPathFactory,
    shown: dict[str, str],
    clicked: dict[str, str],
    password: str,
) -> None:
    folder = tmp_path_factory.mktemp("runtime")
    shown_stores.record(folder, _address(shown))
    with_password = _address(clicked, f"password={password}&application_name=x")
    same = all(shown[k].lower() == clicked[k].lower() for k in shown)
    assert shown_stores.was_shown(folder, with_password) is same


@pytest.mark.duckdb_only
def test_the_list_is_private_bounded_and_forgets_ended_kernels(tmp_path: Path) -> None:
    folder = tmp_path / "runtime"
    for i in range(shown_stores.MAX_PER_PROCESS + 5):
        shown_stores.record(folder, f"/stores/{i}.duckdb")
    (mine,) = folder.glob("kernelext-shown-*.json")
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600
    assert not shown_stores.was_shown(folder, "/stores/0.duckdb")  # the oldest made room
    assert shown_stores.was_shown(folder, f"/stores/{shown_stores.MAX_PER_PROCESS + 4}.duckdb")
    ended = folder / "kernelext-shown-999999999.json"
    long_ago = time.time() - shown_stores.KEEP_AFTER_EXIT - 60
    entry = {"key": shown_stores.store_key("/stores/old.duckdb"), "at": long_ago}
    owner = f"someone@{socket.gethostname()}:999999999"
    ended.write_text(json.dumps({"owner": owner, "stores": [entry]}))
    os.chmod(ended, 0o600)
    assert not shown_stores.was_shown(folder, "/stores/old.duckdb")  # its kernel ended a day ago
    loose = folder / "kernelext-shown-1.json"
    entry = {"key": shown_stores.store_key("/stores/loose.duckdb"), "at": time.time()}
    loose.write_text(json.dumps({"owner": owner, "stores": [entry]}))
    os.chmod(loose, 0o666)
    assert not shown_stores.was_shown(folder, "/stores/loose.duckdb")  # others may write it
    shown_stores.record(folder, "/stores/new.duckdb")
    assert not ended.exists()  # removed by the next kernel that records
