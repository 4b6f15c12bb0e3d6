"""Store conformance: the writer thread's group commit and what reads see (see
``store_suite.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from kernelext.errors import ReadOnlyError

from .store_suite_support import (
    WAIT,
    Gate,
    StoreFactory,
    events,
    insert_event_job,
    probe_labels,
)

__all__ = ["TestGroupCommit", "TestReads"]


# -- the writer ---------------------------------------------------------------------------
class TestGroupCommit:
    def test_queued_jobs_share_commits_and_resolve_after_commit(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        jobs = 50
        seen_committed: dict[str, bool] = {}

        def check_visible(label: str) -> Callable[[Future[str]], None]:
            def callback(fut: Future[str]) -> None:
                # Runs when the future resolves: the row must already be readable
                # through a reader connection, i.e. committed.
                seen_committed[label] = label in probe_labels(store, "g")

            return callback

        gate = Gate(store)
        before = store.commits
        futures = []
        for i in range(jobs):
            fut = store.write_async(insert_event_job(store, "g", f"{i:03d}"))
            fut.add_done_callback(check_visible(f"{i:03d}"))
            futures.append(fut)
        assert not any(f.done() for f in futures)
        gate.open()
        assert [f.result(WAIT) for f in futures] == [f"{i:03d}" for i in range(jobs)]
        store.flush()
        commits = store.commits - before
        assert commits <= 3, f"{jobs} queued jobs took {commits} commits"
        assert seen_committed == {f"{i:03d}": True for i in range(jobs)}
        assert probe_labels(store, "g") == [f"{i:03d}" for i in range(jobs)]

    def test_a_failing_job_does_not_lose_its_neighbours(self, store_factory: StoreFactory) -> None:
        store = store_factory()

        def bad(tx: Any) -> None:
            store.event(tx, "g", "probe", reason="bad")
            raise ValueError("this job is broken")

        gate = Gate(store)
        first = store.write_async(insert_event_job(store, "g", "first"))
        broken = store.write_async(bad)
        last = store.write_async(insert_event_job(store, "g", "last"))
        gate.open()
        assert first.result(WAIT) == "first"
        assert last.result(WAIT) == "last"
        with pytest.raises(ValueError, match="broken"):
            broken.result(WAIT)
        assert probe_labels(store, "g") == ["first", "last"]
        # The writer survives and keeps working.
        assert store.write(insert_event_job(store, "g", "after")) == "after"

    def test_sync_write_returns_the_job_result_and_raises_its_error(
        self, store_factory: StoreFactory
    ) -> None:
        store = store_factory()
        assert store.write(lambda tx: tx.fetchone("SELECT 41 + 1")) == (42,)

        def broken(tx: Any) -> None:
            store.event(tx, "g", "probe", reason="rolled back")
            raise KeyError("nope")

        with pytest.raises(KeyError):
            store.write(broken)
        assert probe_labels(store, "g") == []

    def test_closed_store_refuses_writes_clearly(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.close()
        with pytest.raises(RuntimeError, match="closed"):
            store.write(lambda tx: None)
        store.close()  # closing twice is harmless


class TestReads:
    def test_reads_see_only_committed_data(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        inside = threading.Event()
        release = threading.Event()

        def job(tx: Any) -> None:
            store.event(tx, "g", "probe", reason="uncommitted")
            inside.set()
            release.wait(WAIT)

        fut = store.write_async(job)
        assert inside.wait(WAIT)
        # A backend may answer a read at once (from the last commit) or hold it until
        # the open transaction ends; it may never answer with the uncommitted row.
        seen: list[tuple[list[str], bool]] = []

        def read() -> None:
            labels = probe_labels(store, "g")
            seen.append((labels, release.is_set()))

        readers = [threading.Thread(target=read) for _ in range(3)]
        try:
            for reader in readers:
                reader.start()
            for reader in readers:
                reader.join(2.0)
        finally:
            release.set()
        for reader in readers:
            reader.join(WAIT)
        fut.result(WAIT)
        assert len(seen) == len(readers)
        for labels, released in seen:
            assert released or labels == [], "a read saw a row before its commit"
        assert probe_labels(store, "g") == ["uncommitted"]

    @pytest.mark.parametrize(
        "statement",
        [
            "DELETE FROM events",
            "INSERT INTO events (run_id, occurred_at, kind) VALUES ('x', now(), 'probe')",
            "UPDATE runs SET status = 'completed'",
            "DROP TABLE runs",
            "CREATE TABLE sneaky (x INTEGER)",
            "SELECT 1; DELETE FROM events",
            "",
        ],
    )
    def test_read_arrow_refuses_writes(self, store_factory: StoreFactory, statement: str) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        with pytest.raises(ReadOnlyError, match="read-only"):
            store.backend.read_arrow(statement)
        assert store.get_run("r1")["status"] == "running"
        assert len(events(store, "r1")) == 1
        assert store.read("SELECT count(*) FROM runs") == [(1,)]

    def test_read_arrow_returns_a_table(self, store_factory: StoreFactory) -> None:
        store = store_factory()
        store.create_run("r1", "agent")
        table = store.backend.read_arrow("SELECT id, status FROM runs")
        assert table.num_rows == 1
        assert table.to_pylist() == [{"id": "r1", "status": "running"}]
        # Still writable afterwards: the read-only transaction was closed.
        assert store.create_run("r2", "agent")
