"""run.map items in worker processes renew a heartbeat while they run; a take-over asks no
probe for a call of an item whose worker is still alive, however long the call takes, and
asks it once that attempt has ended (its heartbeat lapsed).

Real parts: PostgreSQL, a process pool of spawned worker processes, the local HTTP server
that counts deliveries by Idempotency-Key and answers the probe (``GET /deliveries?key=``).
The grace period a take-over gives the previous owner itself (``PROBE_GRACE_SECONDS``) is
set to 0 here: the calls below outlast any such period, and only the heartbeat holds.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import multiprocessing
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.http_server import DeliveryServer
from support.pool_calls import WAIT, deliver_effect, per_key

import kernelext as kx
from kernelext._core.lifecycle import takeover
from kernelext._store.heartbeats import HEARTBEAT_LAPSE_SECONDS

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def _only_the_heartbeat_holds(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's grace period is 0 and the store is PostgreSQL (module docstring)."""
    monkeypatch.setattr(takeover, "PROBE_GRACE_SECONDS", 0.0)
    kx.configure(store=postgres_url)


def _probed_effect(url: str, gate: str) -> Any:
    def lookup(key: str, args: Any) -> Any:
        with urllib.request.urlopen(f"{url}/deliveries?key={key}", timeout=5) as answer:
            found = json.loads(answer.read())
        return (
            ("applied", {"delivery": found["first"]["seq"]}) if found["applied"] else "not_applied"
        )

    return deliver_effect(kx, url, gate, probe=lookup)


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url) as con:
        row = con.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _until(what: str, ready: Any, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < end, f"waited {timeout} s for {what}"
        time.sleep(0.05)


def _start_in_calls(
    store_url: str, url: str, chosen: dict[str, Any], gate: str, run_id: str
) -> Any:
    """A run of two items on ``chosen["executor"]`` (a resume maps them on what it holds
    then), returned once the workers began both calls (intents recorded, the POSTs waiting
    for ``gate``)."""
    deliver = _probed_effect(url, gate)

    def one(item: str) -> Any:
        return deliver(item)["delivery"]

    @kx.agent(name=f"heartbeat_{run_id}")
    def agent(run: Any, items: list[str]) -> Any:
        return run.map(one, items, executor=chosen["executor"])

    handle = agent.start(["a", "b"], run_id=run_id)
    pending = f"SELECT count(*) FROM effects WHERE run_id = '{run_id}' AND status = 'pending'"
    _until("both intents", lambda: _count(store_url, pending) == 2)
    return handle


def _resume_until(run_id: str, wanted: str, timeout: float) -> str:
    end, status = time.monotonic() + timeout, ""
    while time.monotonic() < end:
        handle = kx.resume(run_id)
        status = handle.wait(WAIT)
        if status == wanted:
            return status
        assert status in ("needs_decision", "suspended"), handle.error
        time.sleep(1.0)
    return status


def _probe_decisions(url: str, run_id: str) -> int:
    return _count(
        url, f"SELECT count(*) FROM effects WHERE run_id = '{run_id}' AND decided_by LIKE 'probe:%'"
    )


def test_no_probe_is_asked_while_a_worker_is_still_making_the_call(
    postgres_url: str,
    delivery_server: DeliveryServer,
    spawned_pool: concurrent.futures.ProcessPoolExecutor,
    tmp_path: Path,
) -> None:
    gate, chosen = str(tmp_path / "go"), {"executor": spawned_pool}
    handle = _start_in_calls(postgres_url, delivery_server.url, chosen, gate, "long-calls")
    handle.force_stop()  # the futures are cancelled; the workers go on with their calls
    assert handle.wait(WAIT) == "suspended"
    assert kx.resume("long-calls").wait(WAIT) == "needs_decision"
    for _ in range(3):  # the workers are still inside their calls: resumes ask no probe
        time.sleep(1.0)
        again = kx.resume("long-calls")
        assert again.wait(WAIT) == "needs_decision"
        assert _probe_decisions(postgres_url, "long-calls") == 0, "a probe was asked"
    with psycopg.connect(postgres_url) as con:
        (reason,) = con.execute(
            "SELECT reason FROM events WHERE run_id = 'long-calls' AND kind = 'needs_decision'"
            " ORDER BY id DESC LIMIT 1"
        ).fetchone() or ("",)
    assert "still running in a worker process" in reason, reason
    listed = kx.reconcile("long-calls")
    assert [u.worker_running for u in listed] == [True, True]
    assert listed.text().count("caution: a worker process is still running") == 2
    assert delivery_server.count() == 0

    Path(gate).touch()  # the calls arrive now; the workers' attempts end (a stale epoch)
    delivery_server.wait_for(2, timeout=WAIT)
    status = _resume_until("long-calls", "completed", HEARTBEAT_LAPSE_SECONDS + WAIT)
    assert status == "completed", "once the attempts ended their calls were probed"
    assert _probe_decisions(postgres_url, "long-calls") == 2, "both decided by the probe"
    delivery_server.settle()
    assert sorted(per_key(delivery_server).values()) == [1, 1], "each call made once"


def test_a_killed_worker_holds_no_probe_back_once_its_heartbeat_lapsed(
    postgres_url: str,
    delivery_server: DeliveryServer,
    spawned_pool: concurrent.futures.ProcessPoolExecutor,
    tmp_path: Path,
) -> None:
    gate, chosen = str(tmp_path / "go"), {"executor": spawned_pool}
    handle = _start_in_calls(postgres_url, delivery_server.url, chosen, gate, "killed-worker")
    for pid in list(spawned_pool._processes):  # both workers die inside their calls
        os.kill(pid, signal.SIGKILL)
    assert handle.wait(WAIT) == "failed", handle.error
    killed_at = time.monotonic()
    Path(gate).touch()  # calls made from now on go through
    chosen["executor"] = fresh = concurrent.futures.ProcessPoolExecutor(
        2, mp_context=multiprocessing.get_context("spawn")
    )
    status = _resume_until("killed-worker", "completed", HEARTBEAT_LAPSE_SECONDS + WAIT)
    assert status == "completed", "the probes answered once the heartbeats lapsed"
    assert time.monotonic() - killed_at < HEARTBEAT_LAPSE_SECONDS + WAIT
    fresh.shutdown()
    assert _probe_decisions(postgres_url, "killed-worker") == 2
    delivery_server.settle()
    assert sorted(per_key(delivery_server).values()) == [1, 1], "each call made once"


def test_a_worker_never_closes_the_store_of_an_attempt_still_running(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker serving more runs than it keeps stores for closes only idle ones: an
    attempt inside a long call keeps its store (and so its heartbeat) open."""
    import uuid

    from kernelext._core.batch import remote_item
    from kernelext._core.batch.wire import RemoteTask
    from kernelext._store.postgres_backend import url_without_password

    monkeypatch.setattr(remote_item, "KEEP_STORES", 1)
    monkeypatch.setattr(remote_item, "_stores", collections.OrderedDict())
    url = url_without_password(postgres_url)
    monkeypatch.setenv("KERNELEXT_STORE", postgres_url)

    def task(run_id: str) -> RemoteTask:
        return RemoteTask(
            url=url, run_id=run_id, epoch=1, agent="a", key_scheme=1, chain_root="",
            step_id=uuid.uuid4(), key="item-0", ordinal=0, name=None,
            max_step_seconds=None, fn_blob=b"", item_blob=b"",
        )  # fmt: skip

    with remote_item._store_for(task("evict-long")) as long_running:
        for other in ("evict-b", "evict-c"):  # other runs' attempts come and go meanwhile
            with remote_item._store_for(task(other)) as store:
                assert not store.closed
        assert not long_running.closed, "the store of a running attempt was closed"
        long_running.beat_steps("evict-long", [uuid.uuid4()])  # its heartbeat goes through
    kept = list(remote_item._stores.values())
    assert len(kept) == 1, "idle stores beyond the limit are closed once their attempts end"
    for store in kept:
        store.close()
