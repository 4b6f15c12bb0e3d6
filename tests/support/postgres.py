"""A real, throw-away PostgreSQL server for the tests and the benchmarks.

``PostgresServer`` finds Debian's binaries (``initdb`` on PATH, else the newest
``/usr/lib/postgresql/*/bin``), runs ``initdb`` into a fresh folder under /tmp,
and starts ``postgres`` listening on 127.0.0.1 only, on a free port, with its
unix socket in that folder and trust authentication. PostgreSQL refuses to run
as root, so as root it runs as the ``postgres`` system user (Debian's package
creates it). The server is a foreground child of this process that gets SIGINT
(fast shutdown) when this process dies, however it dies, so a killed test run
leaves no server behind. ``stop()`` shuts it down and removes the folder.

``fsync=False`` (the default for the tests) skips disk flushes: the tests kill
clients, never the server, so they do not depend on the server's durability.
The benchmarks keep the server's defaults.

The pytest fixtures at the bottom are imported by tests/conftest.py:
``postgres_server`` (one per session: under pytest-xdist, one per worker, each
in its own folder on its own port) and ``postgres_url`` (a fresh database per test).
The clean-up of stale folders never touches a live server's folder (it has a
``postmaster.pid``) nor one younger than an hour (a server still being set up).

Standalone: ``python tests/support/postgres.py`` starts a server, prints its
URL and waits for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from types import TracebackType

__all__ = ["PostgresServer", "find_postgres_bin", "postgres_server", "postgres_url"]

SUPERUSER = "kx"
FOLDER_PREFIX = "kernelext-pg-"


def find_postgres_bin() -> str | None:
    """The folder holding initdb/pg_ctl/postgres, or None when PostgreSQL is missing."""
    initdb = shutil.which("initdb")
    if initdb:
        real = os.path.realpath(initdb)
        folder = os.path.dirname(real)
        if os.path.exists(os.path.join(folder, "pg_ctl")):
            return folder
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) if x.isdigit() else x for x in p.split("/")[4].split(".")],
    )
    return os.path.dirname(candidates[-1]) if candidates else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    """Start with ``with PostgresServer() as pg: pg.url`` (or ``start()``/``stop()``)."""

    def __init__(self, *, fsync: bool = True, max_connections: int = 200) -> None:
        folder = find_postgres_bin()
        if folder is None:
            raise RuntimeError(
                "PostgreSQL is not installed (no initdb on PATH or in "
                "/usr/lib/postgresql/*/bin). Install Debian's package: "
                "`apt-get install postgresql` (or run `make system-deps`)."
            )
        self.bin = folder
        self.fsync = fsync
        self.max_connections = max_connections
        self.root = ""
        self.port = 0
        self._counter = itertools.count(1)
        self._user: pwd.struct_passwd | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> PostgresServer:
        _remove_stale_folders()
        self.root = tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir="/tmp")
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "Running as root, but there is no `postgres` system user to run the "
                    "server as (PostgreSQL refuses root). Install Debian's postgresql package."
                ) from None
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._run(
            "initdb", "-D", self.datadir, "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        for attempt in range(5):
            self.port = _free_port()
            try:
                self._launch()
                break
            except RuntimeError:
                if attempt == 4:
                    raise
        return self

    def _launch(self) -> None:
        """Run ``postgres`` in the foreground as our child; it dies with this process."""
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": self.root,
            "max_connections": str(self.max_connections),
            "fsync": "on" if self.fsync else "off",
            "TimeZone": "UTC",
        }
        if not self.fsync:
            settings.update(synchronous_commit="off", full_page_writes="off")
        command = [os.path.join(self.bin, "postgres"), "-D", self.datadir]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with open(os.path.join(self.root, "server.log"), "ab") as log:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                preexec_fn=self._child_setup,
            )
        deadline = time.monotonic() + 60
        while True:
            if self._proc.poll() is not None:
                self._proc = None
                raise RuntimeError(f"postgres did not start:\n{self.log()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                if self._accepts_queries():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not accept connections:\n{self.log()[-2000:]}")
            time.sleep(0.05)

    def _accepts_queries(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=2) as con:
                con.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def _child_setup(self) -> None:
        """In the child: drop root (PostgreSQL refuses it), then die with the parent."""
        if self._user is not None:
            os.setgid(self._user.pw_gid)
            os.setgroups([])
            os.setuid(self._user.pw_uid)
        # PR_SET_PDEATHSIG after setuid (a credential change clears it): a fast shutdown
        # (SIGINT) when the test process goes away, even by SIGKILL or os._exit.
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGINT)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: disconnect clients, checkpoint
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGQUIT)  # immediate shutdown
                proc.wait(60)
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = ""

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what tests use ------------------------------------------------------------------
    @property
    def datadir(self) -> str:
        return os.path.join(self.root, "data")

    def url_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        """The maintenance database ``postgres``."""
        return self.url_for("postgres")

    def create_database(self, prefix: str = "kx_test") -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(self._counter)}"
        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log(self) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.root, "server.log")) as fh:
            return fh.read()
        return ""

    # -- plumbing ------------------------------------------------------------------------
    def _run(self, program: str, *args: str) -> None:
        command = [os.path.join(self.bin, program), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user.pw_name, "--", *command]
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=120, cwd=self.root or "/"
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout}"
            )


def _remove_stale_folders(max_age_s: float = 3600.0) -> None:
    """Folders of servers that are gone (a killed test run), untouched for an hour."""
    for folder in glob.glob(f"/tmp/{FOLDER_PREFIX}*"):
        try:
            running = os.path.exists(os.path.join(folder, "data", "postmaster.pid"))
            age = time.time() - os.stat(folder).st_mtime
        except OSError:
            continue
        if not running and age > max_age_s:
            shutil.rmtree(folder, ignore_errors=True)


# -- pytest fixtures (imported into tests/conftest.py) ------------------------------------
try:
    import pytest
except ImportError:  # pragma: no cover - standalone use without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture(scope="session")
    def postgres_server() -> Iterator[PostgresServer]:
        """One real PostgreSQL server per session or xdist worker (127.0.0.1, free port)."""
        server = PostgresServer(fsync=False)
        server.start()
        try:
            yield server
        finally:
            server.stop()

    @pytest.fixture
    def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
        """A fresh, empty database on the session's server; dropped afterwards."""
        url = postgres_server.create_database()
        yield url
        postgres_server.drop_database(url)


def main() -> int:
    with PostgresServer() as server:
        print(server.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
