"""Which stores a click may open: the route opens only a kernelext store, never waits
without bound, and never repeats a password (``kernelext._core.process.click_stores``).

A real Jupyter server with kernelext's extension, a real PostgreSQL server, and a tarpit
(a TCP port that accepts connections and never answers) standing for a host that hangs.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from browser import jupyterlab as lab
from support.route import module_lab_server, post  # noqa: F401  (the fixture `server`)

import kernelext as kx

pytestmark = [pytest.mark.slow]


@pytest.fixture
def tarpit() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def duckdb_store(tmp_path: Path) -> str:
    path = str(tmp_path / "runs.duckdb")
    kx.open_store(path).close()
    return path


def test_a_host_that_never_answers_holds_its_own_turns_not_the_route(
    server: lab.LabServer, tarpit: int, tmp_path: Path
) -> None:
    """Ten clicks naming a host that hangs (one asking libpq to wait forever) are answered,
    and a click on another store meanwhile is answered at once."""
    store = duckdb_store(tmp_path)
    hanging = [f"postgresql://kx@127.0.0.1:{tarpit}/db{i}?connect_timeout=0" for i in range(10)]
    with ThreadPoolExecutor(10) as pool:
        clicks = [
            pool.submit(post, server, "stop", {"run_id": "r", "store": url}) for url in hanging
        ]
        time.sleep(1.0)  # every hanging click has been taken by the server by now
        status, answer = post(server, "stop", {"run_id": "nobody", "store": store})
        waiting = sum(not click.done() for click in clicks)  # none answered before it
        answers = [click.result(timeout=60) for click in clicks]
    assert status == 404 and "nobody" in answer["message"], answer
    assert waiting == len(clicks), f"a click on another store waited for {len(clicks) - waiting}"
    odd = [(code, answer) for code, answer in answers if code not in (503, 504)]
    assert not odd, odd


@pytest.mark.postgres
def test_a_postgres_database_that_is_not_a_store_is_left_as_it_was(
    server: lab.LabServer, postgres_url: str
) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as con:
        con.execute("CREATE TABLE mydata (x int)")
    status, answer = post(server, "stop", {"run_id": "r", "store": postgres_url})
    assert status == 400 and "is not a kernelext store" in answer["message"], answer
    with psycopg.connect(postgres_url, autocommit=True) as con:
        tables = con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    assert tables == [("mydata",)]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "option", ["sslkeylogfile={file}", "sslrootcert={file}", "passfile={file}", "service=x"]
)
def test_options_that_name_files_are_refused_and_no_file_is_made(
    server: lab.LabServer, postgres_url: str, tmp_path: Path, option: str
) -> None:
    kx.open_store(postgres_url).close()  # a real kernelext store
    target = tmp_path / "chosen-by-the-click"
    address = f"{postgres_url}?{option.format(file=target)}"
    status, answer = post(server, "stop", {"run_id": "r", "store": address})
    assert status == 400 and "only with the options" in answer["message"], answer
    assert not target.exists()


@pytest.mark.parametrize(
    "address",
    [
        "POSTGRESQL://kx:TOPsecret7@127.0.0.1:1/db",
        "postgresql://kx:TOP/secret7@127.0.0.1:1/db",
        "postgresql://kx:TOP%2Fsecret7@127.0.0.1:1/db",
        "postgresql://kx@127.0.0.1:1/db?sslpassword=TOPsecret7",
        "postgresql://kx@127.0.0.1:1/db?password=TOPsecret7",
        "postgresql://kx@127.0.0.1:1/db?pass%77ord=TOPsecret7",
        "postgresql://kx:TOPsecret7@127.0.0.1:1/db?bogus=1",
        "postgresql://kx:TOPsecret7@[::1:1/db",
    ],
)
def test_a_password_in_the_address_is_never_repeated(server: lab.LabServer, address: str) -> None:
    status, answer = post(server, "stop", {"run_id": "r", "store": address})
    assert status >= 400
    text = str(answer)
    assert "secret7" not in text and "TOP" not in text, text


def test_every_click_through_the_door() -> None:
    """from_elsewhere opens stores only through click_stores (one door)."""
    import inspect

    from kernelext._core.lifecycle import from_elsewhere

    source = inspect.getsource(from_elsewhere)
    assert "open_store(" not in source and "open_for_click(" in source
