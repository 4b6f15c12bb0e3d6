"""The files beside an embedded store cannot be bent by another user: nothing is opened
through a link, a store another user owns or may write is refused with the command that
fixes it, folders are 0700, and a FIFO, socket or device as the store path is refused at
once. Tests run as root: "another user" is uid 65534 (nobody)."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from support.live import thread_deaths

import kernelext as kx
from kernelext._store import open_store
from kernelext._store.duckdb.fence import FenceFiles
from kernelext.errors import StoreError

NOBODY = 65534
VICTIM_TEXT = b"a file of the person who opens the store\n"
BIG = bytes(range(256)) * 1024  # over the inline limit: stored as a side file


def one_step_agent() -> kx.Agent:
    @kx.agent(name=f"files-{uuid.uuid4().hex[:6]}")
    def agent(run: kx.Run) -> int:
        for i in run.steps(range(1)):
            run.state["i"] = i
            run.state["big"] = BIG  # a side file under <store>.blobs/
        return 1

    return agent


def start_a_run(path: Path) -> None:
    """Open the store at ``path`` and run an agent to the end (creates every file an
    ordinary run creates beside the store: .lock, .want, .wal, .fence/, the journal)."""
    with open_store(str(path)) as store:
        run = one_step_agent().start(run_id="r1", store=store)
        assert run.wait(timeout=60) == "completed"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of the person who opens the store, somewhere else."""
    path = tmp_path / "victim" / "notes.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM_TEXT)
    return path


def fence_file(path: Path, run_id: str) -> Path:
    return Path(FenceFiles(str(path)).path(run_id))


# Each name kernelext creates or opens beside the store, and whether a folder belongs there
# (a new journal has a random name and is created exclusively; a dead process's journal is
# opened by name; the fence folder's files are opened inside its descriptor).
PLANTED: dict[str, tuple[Callable[[Path], Path], bool]] = {
    ".lock": (lambda p: Path(f"{p}.lock"), False),
    ".want": (lambda p: Path(f"{p}.want"), False),
    ".wal": (lambda p: Path(f"{p}.wal"), False),
    ".journal.<a dead process>": (lambda p: Path(f"{p}.journal.1.dead"), False),
    ".fence/<hash of the run id>": (lambda p: fence_file(p, "r2"), False),
    ".fence/": (lambda p: Path(f"{p}.fence"), True),
    ".blobs/": (lambda p: Path(f"{p}.blobs"), True),
}


def error_of_a_second_run(path: Path) -> BaseException | None:
    """Open the store again and run an agent: the error it meets, raised or the run's."""
    try:
        with open_store(str(path)) as store:
            handle = one_step_agent().start(run_id="r2", store=store)
            handle.wait(timeout=60)
            return handle.error
    except StoreError as exc:
        return exc


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_link_planted_beside_the_store_is_never_opened(
    store_path: Path, victim: Path, name: str
) -> None:
    """A link at any name beside the store, pointing at a file (or folder) of the
    victim's, is refused by name; the victim's file is neither truncated nor written, and
    nothing is created in the victim's folder."""
    start_a_run(store_path)  # a store that exists, as the one a user opens again
    where, folder = PLANTED[name]
    planted = where(store_path)
    if planted.is_dir() and not planted.is_symlink():
        shutil.rmtree(planted)
    planted.parent.mkdir(exist_ok=True)
    planted.unlink(missing_ok=True)
    planted.symlink_to(victim.parent if folder else victim)
    error = error_of_a_second_run(store_path)
    assert isinstance(error, StoreError), error
    assert "symbolic link" in str(error) and f"rm {planted}" in str(error)
    assert victim.read_bytes() == VICTIM_TEXT
    assert os.listdir(victim.parent) == [victim.name]


def test_a_link_planted_at_want_while_the_store_is_open_leaves_its_writer_writing(
    store_path: Path,
    victim: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """.want replaced by a link while the store is open, before its writer first looks
    for a waiting process: the link is refused (said once, as a warning), the writer's
    thread lives on and later writes commit; the victim's file is untouched."""
    died = thread_deaths(monkeypatch)
    want = Path(f"{store_path}.want")
    with caplog.at_level(logging.WARNING, logger="kernelext"), open_store(str(store_path)) as store:
        want.unlink()
        want.symlink_to(victim)
        time.sleep(0.6)  # past min_hold (0.25 s): the writer looked at .want, idle ticks too
        store.write_async(lambda tx: tx.execute("SELECT 1")).result(timeout=10)
        assert died == []
    assert victim.read_bytes() == VICTIM_TEXT
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and f"rm {want}" in warned[0], warned


@pytest.mark.parametrize(
    "change, fix",
    [
        (lambda p: os.chmod(p, 0o777), "chmod go-w"),
        (lambda p: (os.chmod(p, 0o775), os.chown(p, 0, NOBODY)), "chmod go-w"),
        (lambda p: os.chown(p, NOBODY, NOBODY), "chown root"),
    ],
    ids=["world-writable", "group-writable", "owned-by-nobody"],
)
def test_a_store_folder_another_user_owns_or_may_write_is_refused(
    store_path: Path, victim: Path, change: Callable[[Path], None], fix: str
) -> None:
    """The user 'nobody' who may write the folder plants a link at .lock to the victim's
    file before the victim first opens the store: refused, with the command that fixes it,
    and the victim's file is untouched."""
    folder = store_path.parent
    change(folder)
    lock = Path(f"{store_path}.lock")
    lock.symlink_to(victim)
    os.lchown(lock, NOBODY, NOBODY)
    with pytest.raises(StoreError) as caught:
        open_store(str(store_path)).close()
    message = str(caught.value)
    assert f"{fix} {folder}" in message
    assert victim.read_bytes() == VICTIM_TEXT
    assert not store_path.exists()  # nothing was created


def test_a_store_directly_in_a_shared_folder_like_tmp_is_refused_with_a_folder_of_ones_own(
    tmp_path: Path,
) -> None:
    """A folder every user may write with the sticky bit (/tmp): a `chmod` of it is not the
    fix, a private folder inside it is (kernelext creates it 0700)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(StoreError, match="like /tmp") as caught:
        open_store(str(shared / "store.duckdb")).close()
    suggested = str(caught.value).split("KERNELEXT_STORE=")[1].split(" ")[0]
    assert not list(shared.iterdir())  # nothing was created
    with open_store(suggested) as store:
        assert store.read("SELECT count(*) FROM runs") == [(0,)]
    assert stat.S_IMODE(Path(suggested).parent.stat().st_mode) == 0o700


def test_a_folder_writable_by_ones_own_private_group_is_accepted(store_path: Path) -> None:
    """A umask of 002 with user private groups (root:root here): as private as 0755."""
    store_path.parent.chmod(0o775)
    start_a_run(store_path)


def test_a_store_link_into_a_folder_another_user_may_write_is_refused(tmp_path: Path) -> None:
    """The store path is a link of yours to a file in a folder 'nobody' may write; they
    point that file, a link of theirs, at a place only you may write: refused before
    DuckDB creates anything there."""
    mine, shared, private = tmp_path / "mine", tmp_path / "shared", tmp_path / "root-only"
    for folder in (mine, shared, private):
        folder.mkdir(mode=0o700)
    os.chown(shared, NOBODY, NOBODY)
    shared.chmod(0o777)
    planted = shared / "real.duckdb"
    planted.symlink_to(private / "planted.duckdb")
    os.lchown(planted, NOBODY, NOBODY)
    store = mine / "store.duckdb"
    store.symlink_to(planted)
    with pytest.raises(StoreError, match=str(shared)):
        open_store(str(store)).close()
    assert not (private / "planted.duckdb").exists()


def test_duckdbs_spill_folder_of_another_user_is_refused(store_path: Path) -> None:
    """DuckDB spills big queries to ``<store>.tmp``: a folder there that another user owns
    (or a link) is refused like any file beside the store."""
    start_a_run(store_path)
    spill = Path(f"{store_path}.tmp")
    spill.mkdir(mode=0o777)
    os.chown(spill, NOBODY, NOBODY)
    with pytest.raises(StoreError, match=str(spill)):
        open_store(str(store_path)).close()
    shutil.rmtree(spill)
    spill.symlink_to(store_path.parent)
    with pytest.raises(StoreError, match="link"):
        open_store(str(store_path)).close()


@pytest.mark.parametrize("mode, owner", [(0o666, NOBODY), (0o666, 0), (0o600, NOBODY)])
def test_a_store_file_another_user_owns_or_may_write_is_refused(
    store_path: Path, mode: int, owner: int
) -> None:
    start_a_run(store_path)
    os.chown(store_path, owner, owner)
    os.chmod(store_path, mode)
    fix = "chown root" if owner else "chmod go-w"
    with pytest.raises(StoreError, match=fix):
        open_store(str(store_path)).close()


def test_a_side_file_another_user_owns_is_refused(store_path: Path) -> None:
    start_a_run(store_path)
    want = Path(f"{store_path}.want")
    os.chown(want, NOBODY, NOBODY)
    with pytest.raises(StoreError, match=f"chown root {want}"):
        open_store(str(store_path)).close()


def test_folders_beside_the_store_are_private(store_path: Path) -> None:
    """.fence/ (made 0755 by earlier releases: made 0700 again), .blobs/ are 0700."""
    start_a_run(store_path)
    fence = Path(f"{store_path}.fence")
    assert stat.S_IMODE(fence.stat().st_mode) == 0o700
    fence.chmod(0o755)  # as an earlier release left it
    with open_store(str(store_path)) as store:
        one_step_agent().start(run_id="r2", store=store).wait(timeout=60)
    assert stat.S_IMODE(fence.stat().st_mode) == 0o700
    for name in os.listdir(fence):
        assert stat.S_IMODE((fence / name).stat().st_mode) == 0o600


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))  # the socket file stays after it is closed


def make_device(path: Path) -> None:
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null


@pytest.mark.parametrize(
    "make, kind",
    [(make_fifo, "named pipe"), (make_socket, "socket"), (make_device, "character device")],
)
def test_a_fifo_socket_or_device_as_the_store_is_refused_at_once(
    tmp_path: Path, make: Callable[[Path], None], kind: str
) -> None:
    """Opened in a subprocess with a deadline: on a FIFO, DuckDB would wait forever."""
    path = tmp_path / "store.duckdb"
    make(path)
    code = (
        "import sys\nfrom kernelext._store import open_store\nfrom kernelext.errors import "
        "StoreError\ntry:\n    open_store(sys.argv[1]).close()\nexcept StoreError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert kind in done.stdout
    assert "KERNELEXT_STORE" in done.stdout


def test_a_fifo_beside_the_store_is_refused_at_once(store_path: Path) -> None:
    start_a_run(store_path)
    want = Path(f"{store_path}.want")
    want.unlink()
    os.mkfifo(want)
    with pytest.raises(StoreError, match="named pipe"):
        open_store(str(store_path)).close()


def test_a_read_only_store_of_another_user_still_reads(store_path: Path) -> None:
    """Reading someone else's store (read_only=True) writes nothing, so it is not refused
    for its owner; links and FIFOs still are."""
    start_a_run(store_path)
    for path in [store_path.parent, *store_path.parent.iterdir()]:
        os.chown(path, NOBODY, NOBODY)
    with open_store(str(store_path), read_only=True) as store:
        assert store.read_only
        assert kx.sql("SELECT status FROM runs", store=store)["status"].tolist() == ["completed"]
