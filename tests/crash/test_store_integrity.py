"""Integrity and portability of the store: payload hashes are checked on every read, a
project folder can move, and a store from a newer release or a foreign DuckDB file is
refused without writing a byte into it."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pytest

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store
from kernelext._store.schema import MIGRATIONS
from kernelext.errors import ForeignStoreError, IntegrityError, SchemaTooNewError, StoreError

WAIT = 60.0
BIG = bytes(range(256)) * 1024  # 256 KiB: goes to a side file
NEWEST = max(m.version for m in MIGRATIONS)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def pausing_agent() -> Any:
    """Step 0 stores a big and a small value, then suspends; a resume runs step 1."""

    @kx.agent(name=unique("bulky"))
    def bulky(run: kx.Run) -> tuple[str, int]:
        for i in run.steps(range(2)):
            if i == 0:
                run.state["big"] = BIG
                run.state["small"] = {"n": 1}
                run.suspend("approval")
            run.state["small"] = {"n": run.state["small"]["n"] + i}
        return hashlib.sha256(run.state["big"]).hexdigest(), run.state["small"]["n"]

    return bulky


def suspended_run(run_id: str) -> Any:
    agent = pausing_agent()
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    return agent


def blob_row(store: Store, run_id: str, *, side_file: bool) -> tuple[uuid.UUID, str, str]:
    """(id, location, sha256) of the run's one side-file blob, or of its inline blob."""
    op = "<>" if side_file else "="
    rows = store.read(
        f"SELECT id, location, sha256 FROM blobs WHERE run_id = ? AND location {op} 'inline'",
        (run_id,),
    )
    assert len(rows) == 1, rows
    bid, location, sha = rows[0]
    return bid, str(location), str(sha)


def side_file(store: Store, run_id: str) -> Path:
    _, location, _ = blob_row(store, run_id, side_file=True)
    assert location.startswith("file:")
    return Path(store.blob_dir(run_id)) / Path(location.removeprefix("file:")).name


def flip_one_byte(path: Path, at: int = 1000) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def resume_completes(run_id: str) -> None:
    handle = kx.resume(run_id)
    assert handle.wait(WAIT) == "completed"
    assert handle.result == (hashlib.sha256(BIG).hexdigest(), 2)


# -- payload hashes --------------------------------------------------------------------
def test_an_edited_side_file_is_refused_and_the_run_resumes_once_it_is_restored(
    store: Store,
) -> None:
    suspended_run("edited")
    path = side_file(store, "edited")
    _, _, sha = blob_row(store, "edited", side_file=True)
    original = path.read_bytes()
    flip_one_byte(path)
    found = hashlib.sha256(path.read_bytes()).hexdigest()

    with pytest.raises(IntegrityError) as caught:
        kx.resume("edited")
    message = str(caught.value)
    for part in (
        "'edited'",
        "run.state['big']",
        "saved at step 1",
        str(path),
        sha[:12],
        found[:12],
    ):
        assert part in message, (part, message)
    assert "backup" in message and "kx.restart('edited', from_step=0)" in message
    # Refused before anything changed: the run still waits, resumable.
    assert store.get_run("edited")["status"] == "suspended"
    assert [e["kind"] for e in store.events("edited")][-1] != "resumed"

    path.write_bytes(original)  # restored from a backup
    resume_completes("edited")


def test_a_missing_side_file_is_an_integrity_error_not_a_file_not_found(store: Store) -> None:
    suspended_run("missing")
    path = side_file(store, "missing")
    original = path.read_bytes()
    path.unlink()

    with pytest.raises(IntegrityError) as caught:
        kx.resume("missing")
    message = str(caught.value)
    assert "missing" in message and str(path) in message and "run.state['big']" in message
    assert not isinstance(caught.value, FileNotFoundError)
    assert store.get_run("missing")["status"] == "suspended"

    path.write_bytes(original)
    resume_completes("missing")


def test_an_edited_inline_payload_is_refused_too(store: Store) -> None:
    suspended_run("inline")
    bid, _, sha = blob_row(store, "inline", side_file=False)
    [(data,)] = store.read("SELECT data FROM blobs WHERE id = ?", (bid,))

    def set_data(value: bytes) -> None:
        store.write(lambda tx: tx.execute("UPDATE blobs SET data = ? WHERE id = ?", (value, bid)))

    set_data(b'{"n":2}')
    with pytest.raises(IntegrityError) as caught:
        kx.resume("inline")
    message = str(caught.value)
    assert "run.state['small']" in message and sha[:12] in message and "inline" in message
    assert store.get_run("inline")["status"] == "suspended"

    set_data(bytes(data))
    resume_completes("inline")


def test_the_message_names_the_step_and_its_restart_advice_works(store: Store) -> None:
    pause = {"on": True}

    @kx.agent(name=unique("growing"))
    def growing(run: kx.Run) -> tuple[list[int], str]:
        for i in run.steps(range(4)):
            run.state["xs"] = [*run.state.get("xs", []), i]  # stored as deltas on step 0's
            if i == 1:
                run.state["big"] = BIG
            if i == 2 and pause["on"]:
                run.suspend("approval")
        return run.state["xs"], hashlib.sha256(run.state["big"]).hexdigest()

    assert growing.start(run_id="grow").wait(WAIT) == "suspended"
    # The first value of xs is the base of every later one: all three snapshots need it.
    [(manifest,)] = store.read(
        "SELECT manifest FROM snapshots WHERE run_id = 'grow' AND step_ordinal = 0"
    )
    base = uuid.UUID(hex=json.loads(manifest)["xs"])
    [(data,)] = store.read("SELECT data FROM blobs WHERE id = ?", (base,))
    store.write(lambda tx: tx.execute("UPDATE blobs SET data = ? WHERE id = ?", (b"[9]", base)))
    with pytest.raises(IntegrityError) as caught:
        kx.resume("grow")
    message = str(caught.value)
    assert "run.state['xs']" in message and "saved at step 1, used up to step 3" in message
    assert "kx.restart('grow', from_step=0) starts over" in message
    store.write(lambda tx: tx.execute("UPDATE blobs SET data = ? WHERE id = ?", (data, base)))

    flip_one_byte(side_file(store, "grow"))
    with pytest.raises(IntegrityError) as caught:
        kx.resume("grow")
    message = str(caught.value)
    assert "run.state['big']" in message and "saved at step 2, used up to step 3" in message
    advice = "kx.restart('grow', from_step=1) keeps step 1 and runs step 2 again"
    assert advice in message

    pause["on"] = False
    handle = kx.restart("grow", from_step=1)  # as the message says
    assert handle.wait(WAIT) == "completed"
    assert handle.result == ([0, 1, 2, 3], hashlib.sha256(BIG).hexdigest())


# -- a project folder that moves ---------------------------------------------------------
def test_a_moved_project_folder_resumes_with_its_side_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KERNELEXT_STORE", raising=False)
    before = tmp_path / "proj" / ".kernelext" / "store.duckdb"
    kx.open_store(str(before))
    suspended_run("travels")
    runtime().settings.close()

    shutil.move(str(tmp_path / "proj"), str(tmp_path / "moved"))
    after = tmp_path / "moved" / ".kernelext" / "store.duckdb"
    store = kx.open_store(str(after))
    assert not before.parent.exists()
    _, location, _ = blob_row(store, "travels", side_file=True)
    assert store.payload_path(location).startswith(str(after) + ".blobs" + os.sep)
    resume_completes("travels")
    store.close()


def test_side_file_locations_are_written_relative_to_the_blob_folder(store: Store) -> None:
    suspended_run("relative")
    _, location, _ = blob_row(store, "relative", side_file=True)
    folder = Path(store.blob_dir("relative"))
    assert location.startswith(f"file:{folder.name}/")
    assert not os.path.isabs(location.removeprefix("file:"))
    assert store.payload_path(location) == str(side_file(store, "relative"))


def test_absolute_side_file_locations_of_earlier_releases_are_read(store: Store) -> None:
    """A row written as ``file:<absolute path>`` (earlier releases) reads like a relative one."""
    suspended_run("absolute")
    bid, location, _ = blob_row(store, "absolute", side_file=True)
    absolute = store.payload_path(location)
    assert os.path.isabs(absolute)
    store.write(
        lambda tx: tx.execute(
            "UPDATE blobs SET location = ? WHERE id = ?", ("file:" + absolute, bid)
        )
    )
    assert store.load_blobs("absolute", [bid])[bid].data == BIG
    assert store.payload_path("file:" + absolute) == absolute
    resume_completes("absolute")


def test_a_moved_project_folder_resumes_restarts_and_sweeps_its_side_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KERNELEXT_STORE", raising=False)
    before = tmp_path / "proj" / ".kernelext" / "store.duckdb"
    kx.open_store(str(before))
    kx.configure(retention_seconds=60)
    for run_id in ("resumed", "restarted", "expires"):
        suspended_run(run_id)
    runtime().settings.close()

    shutil.move(str(tmp_path / "proj"), str(tmp_path / "moved"))
    after = tmp_path / "moved" / ".kernelext" / "store.duckdb"
    store = kx.open_store(str(after))
    try:
        assert not before.parent.exists()
        root = str(after) + ".blobs" + os.sep
        [(written,)] = store.read("SELECT count(*) FROM blobs WHERE location LIKE 'file:/%'")
        assert written == 0  # every side file was recorded relative to the blob folder

        resume_completes("resumed")

        restarted = kx.restart("restarted", from_step=1)  # step 0 (with BIG) is carried
        assert restarted.wait(WAIT) == "completed"
        assert restarted.result == (hashlib.sha256(BIG).hexdigest(), 2)
        new_id = restarted.run_id
        _, location, _ = blob_row(store, new_id, side_file=True)
        assert location.startswith(f"file:{Path(store.blob_dir(new_id)).name}/")
        linked = store.payload_path(location)
        assert linked.startswith(root)

        _, location, _ = blob_row(store, "expires", side_file=True)
        doomed = Path(store.payload_path(location))
        assert str(doomed).startswith(root) and doomed.exists()
        result = kx.sweep(now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=365))
        assert result.expired_ids == ["expires"]
        assert result.removed_ids == ["expires"]
        assert result.removed[0].files == 1
        assert not doomed.exists() and not os.path.exists(store.blob_dir("expires"))
        assert os.path.exists(linked)  # the restarted run's copy stays
    finally:
        store.close()


ESCAPES = ["file:../../etc/passwd", "file:..", "file:", "file:x/../../y", "file:./"]


@pytest.mark.parametrize("location", ESCAPES)
def test_a_relative_location_cannot_lead_out_of_the_blob_folder(
    store: Store, location: str
) -> None:
    with pytest.raises(IntegrityError, match="outside the store's side-file folder"):
        store.payload_path(location)
    inner = "file:a/../b/c"  # stays inside: allowed
    assert store.payload_path(inner) == os.path.join(store.blob_root, "b", "c")


def test_a_row_pointing_out_of_the_blob_folder_is_not_read_linked_or_removed(
    store: Store, store_path: Path
) -> None:
    kx.configure(retention_seconds=60)
    suspended_run("escape")
    bid, _, _ = blob_row(store, "escape", side_file=True)
    outside = store_path.parent / "outside.bin"
    outside.write_bytes(BIG)  # even the right bytes are not taken from there
    escaping = "file:" + os.path.relpath(outside, store.blob_root).replace(os.sep, "/")
    assert escaping.startswith("file:../")

    for bad in (escaping, "file:../../etc/passwd"):
        store.write(
            lambda tx, bad=bad: tx.execute("UPDATE blobs SET location = ? WHERE id = ?", (bad, bid))
        )
        with pytest.raises(IntegrityError) as caught:
            kx.resume("escape")
        message = str(caught.value)
        assert bad in message and "run.state['big']" in message and "leads out" in message
        assert store.get_run("escape")["status"] == "suspended"
        with pytest.raises(StoreError):
            kx.restart("escape", from_step=1)
        assert store.get_run("escape")["status"] == "suspended"
        assert store.children("escape") == []

    store.write(
        lambda tx: tx.execute("UPDATE blobs SET location = ? WHERE id = ?", (escaping, bid))
    )
    result = kx.sweep(now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=365))
    assert result.removed_ids == ["escape"]
    assert outside.read_bytes() == BIG  # retention removal did not follow the row out


# -- a store from a newer release ------------------------------------------------------------
def file_state(path: Path) -> tuple[str, list[str]]:
    """The file's hash and the names in its folder."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, sorted(os.listdir(path.parent))


def contents(path: Path) -> dict[str, int]:
    """Every table of a DuckDB file with its row count, read with a raw connection."""
    con = duckdb.connect(str(path))
    try:
        names = [r[0] for r in con.execute("SHOW TABLES").fetchall()]
        return {n: con.execute(f'SELECT count(*) FROM "{n}"').fetchone()[0] for n in names}
    finally:
        con.close()


def test_a_store_from_a_newer_release_is_refused_and_left_as_it_was(store_path: Path) -> None:
    made = open_store(str(store_path))
    made.create_run("kept", "agent")
    made.close()
    con = duckdb.connect(str(store_path))
    con.execute(
        "INSERT INTO schema_version (version, description, applied_at)"
        " VALUES (?, 'from the future', now())",
        (NEWEST + 5,),
    )
    con.close()
    before, tables = file_state(store_path), contents(store_path)

    with pytest.raises(SchemaTooNewError) as caught:
        open_store(str(store_path))
    message = str(caught.value)
    assert str(store_path) in message and "newer kernelext" in message
    assert f"schema {NEWEST + 5}" in message and f"up to {NEWEST}" in message
    assert "upgrade kernelext" in message.lower()
    assert isinstance(caught.value, StoreError)
    assert file_state(store_path) == before and contents(store_path) == tables

    # The right release (here: this one, once the newer row is gone) still opens it.
    con = duckdb.connect(str(store_path))
    con.execute("DELETE FROM schema_version WHERE version > ?", (NEWEST,))
    con.close()
    reopened = open_store(str(store_path))
    assert reopened.schema_version() == NEWEST
    assert [r["id"] for r in reopened.list_runs()] == ["kept"]
    reopened.close()


# -- someone else's DuckDB file ---------------------------------------------------------------
def test_a_foreign_duckdb_file_is_refused_and_nothing_is_created_in_it(store_path: Path) -> None:
    con = duckdb.connect(str(store_path))
    con.execute("CREATE TABLE runs (id INTEGER, athlete TEXT, km DOUBLE)")
    con.execute("INSERT INTO runs VALUES (1, 'ana', 5.0), (2, 'bo', 10.5)")
    con.execute("CREATE TABLE shoes (id INTEGER)")
    con.close()
    before, tables = file_state(store_path), contents(store_path)

    with pytest.raises(ForeignStoreError) as caught:
        open_store(str(store_path))
    message = str(caught.value)
    assert str(store_path) in message and "runs" in message and "shoes" in message
    assert "KERNELEXT_STORE" in message and "kx.open_store" in message
    assert contents(store_path) == tables == {"runs": 2, "shoes": 0}
    assert file_state(store_path)[0] == before[0]
    assert not (store_path.parent / (store_path.name + ".wal")).exists()

    with pytest.raises(ForeignStoreError):  # the default store, from KERNELEXT_STORE
        kx.runs()
    assert contents(store_path) == tables


def test_an_empty_duckdb_file_becomes_a_store(store_path: Path) -> None:
    duckdb.connect(str(store_path)).close()
    store = open_store(str(store_path))
    assert store.schema_version() == NEWEST
    store.create_run("first", "agent")
    assert [r["id"] for r in store.list_runs()] == ["first"]
    store.close()


# -- the same rules on PostgreSQL ----------------------------------------------------------
def pg_execute(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        for statement in statements:
            con.execute(statement.encode())


@pytest.mark.postgres
def test_postgres_refuses_a_foreign_runs_table_but_not_other_tables(postgres_url: str) -> None:
    pg_execute(postgres_url, "CREATE TABLE shoes (id INTEGER)")
    open_store(postgres_url).close()  # another application's tables beside the store: fine

    pg_execute(postgres_url, "DROP SCHEMA public CASCADE", "CREATE SCHEMA public")
    pg_execute(postgres_url, "CREATE TABLE shoes (id INTEGER)", "CREATE TABLE runs (id INTEGER)")
    with pytest.raises(ForeignStoreError, match=r"tables \(runs\) but no schema_version") as e:
        open_store(postgres_url)
    assert "another database" in str(e.value)


@pytest.mark.postgres
def test_postgres_refuses_a_newer_schema(postgres_url: str) -> None:
    open_store(postgres_url).close()
    pg_execute(
        postgres_url,
        "INSERT INTO schema_version (version, description, applied_at)"
        f" VALUES ({NEWEST + 1}, 'from the future', now())",
    )
    with pytest.raises(SchemaTooNewError, match=f"schema {NEWEST + 1}, this release knows up"):
        open_store(postgres_url)
