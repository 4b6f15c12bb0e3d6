"""The batch of the Dask fault tests (tests/batch/test_dask_faults.py): importable by Dask workers.

Each item is one ``@kx.effect`` ``post``: a POST of ``{"run": ..., "item": i}`` to the
test's DeliveryServer (no dedupe, so a duplicate shows; its JSON-lines log is the ground
truth) with the ledger's key as ``Idempotency-Key``. ``Deliver`` is the item function (a
plain picklable object: the workers import this module to run it); the agent
``dask-deliveries`` maps it over ``range(items)`` with the executor this process set in
``EXECUTOR`` (a resume in this process maps it again with the same one), and keeps the list
``run.map`` returned in ``run.state["results"]``.

Every attempt of an item appends ``begin <run> <item> <attempt> <pid>`` and then
``end <run> <item> <attempt> <outcome>`` (``ok`` or the exception's class name) to the
``markers`` file, so that a test can tell which attempts are still in flight and how each
ended. ``held`` items wait, before their POST, for the test: attempt ``n`` (up to
``hold_attempts``) of item ``i`` (attempts are counted across processes by exclusive files
in ``gates``) waits until the file ``gates/release-<i>-<n>`` (or ``gates/release-all``)
exists; ``held_after`` items wait after their POST, for ``gates/release-after-<i>-<n>``.

``decide_from_log`` decides a run's unknown effects from the server's log, as a person
would: applied (with the response the server gave) when the log has a delivery under that
key, not applied otherwise.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crash import append_line, whole_lines

import kernelext as kx
from support.decisions import unknowns_decided_from
from support.http_server import DeliveryServer, post_json, read_log

__all__ = [
    "EXECUTOR",
    "Attempt",
    "Deliver",
    "attempts",
    "decide_from_log",
    "deliveries",
    "in_flight",
    "pid_alive",
    "post",
    "release",
]

TOOL = "post"
GATE_TIMEOUT = 120.0
RELEASE_ALL = "release-all"
EXECUTOR: dict[str, Any] = {}  # "executor": what this process's batches run on


@kx.effect
def post(url: str, body: Any, *, idempotency_key: str | None = None) -> Any:
    """One delivery: POST ``body`` to ``url`` with the ledger's key."""
    assert idempotency_key is not None, "the ledger hands its key to tools that take one"
    response = post_json(url, body, idempotency_key=idempotency_key, timeout=60)
    if response.status != 200:
        raise RuntimeError(f"delivery refused: HTTP {response.status}")
    return response.body


@dataclass(frozen=True)
class Deliver:
    """The item function: ``Deliver(url, run_id, ...)(item)`` posts the item once."""

    url: str
    run_id: str
    pause: float = 0.0  # each attempt dawdles up to this long before and after its POST
    markers: str = ""
    gates: str = ""
    held: tuple[int, ...] = ()
    hold_attempts: int = 1  # how many attempts of a held item wait (the first ones)
    held_after: tuple[int, ...] = ()  # these wait after their POST instead

    def __call__(self, item: int) -> dict[str, Any]:
        attempt = self._attempt(item)
        self._mark(f"begin {self.run_id} {item} {attempt} {os.getpid()}")
        outcome = "ok"
        try:
            self._dawdle()
            if item in self.held and attempt <= self.hold_attempts:
                self._wait_for(Path(self.gates), f"release-{item}-{attempt}")
            body = post(self.url + "/items", {"run": self.run_id, "item": item})
            if item in self.held_after and attempt <= self.hold_attempts:
                self._wait_for(Path(self.gates), f"release-after-{item}-{attempt}")
            self._dawdle()
            return {"item": item, "delivery": body["delivery"], "key": body["idempotency_key"]}
        except BaseException as exc:
            outcome = type(exc).__name__
            raise
        finally:
            self._mark(f"end {self.run_id} {item} {attempt} {outcome}")

    def _attempt(self, item: int) -> int:
        """This attempt's number for ``item``, counted across processes (1 without gates)."""
        if not self.gates:
            return 1
        for n in range(1, 1000):
            try:
                name = f"attempt-{self.run_id}-{item}-{n}"
                os.close(os.open(Path(self.gates) / name, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            return n
        raise RuntimeError(f"item {item}: too many attempts")

    def _mark(self, line: str) -> None:
        if self.markers:
            append_line(self.markers, line)

    def _dawdle(self) -> None:
        if self.pause:
            time.sleep(random.uniform(0, self.pause))

    @staticmethod
    def _wait_for(gates: Path, name: str) -> None:
        deadline = time.monotonic() + GATE_TIMEOUT
        while not (gates / name).exists() and not (gates / RELEASE_ALL).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"nobody created {gates / name}")
            time.sleep(0.01)


def release(
    gates: Path | str, item: int | None = None, attempt: int = 1, *, after: bool = False
) -> None:
    """Let attempt ``attempt`` of held item ``item`` go on to its POST (``after``: on from
    its POST), every held attempt, now and later, when ``item`` is None."""
    where = "release-after" if after else "release"
    name = RELEASE_ALL if item is None else f"{where}-{item}-{attempt}"
    (Path(gates) / name).touch()


@kx.agent(name="dask-deliveries")
def deliveries(
    run: kx.Run,
    url: str,
    items: int,
    concurrency: int,
    pause: float = 0.0,
    markers: str = "",
    gates: str = "",
    held: tuple[int, ...] = (),
    hold_attempts: int = 1,
    held_after: tuple[int, ...] = (),
) -> int:
    fn = Deliver(url, run.id, pause, markers, gates, tuple(held), hold_attempts, tuple(held_after))
    results = run.map(
        fn,
        range(items),
        key=lambda i: f"item-{i}",
        concurrency=concurrency,
        executor=EXECUTOR["executor"],
    )
    with run.step("results"):
        run.state["results"] = results
    return len(results)


# -- what the markers say ------------------------------------------------------------------
@dataclass(frozen=True)
class Attempt:
    run_id: str
    item: int
    attempt: int
    pid: int
    outcome: str | None  # None: still in flight (or its process died inside it)


def attempts(markers: Path | str) -> list[Attempt]:
    """Every attempt the markers file records, in the order they began."""
    path = Path(markers)
    begun = whole_lines(path, r"begin (\S+) (\d+) (\d+) (\d+)")
    ended = {
        (m[1], int(m[2]), int(m[3])): m[4]
        for m in whole_lines(path, r"end (\S+) (\d+) (\d+) (\w+)")
    }
    out = []
    for m in begun:
        run_id, item, attempt = m[1], int(m[2]), int(m[3])
        out.append(Attempt(run_id, item, attempt, int(m[4]), ended.get((run_id, item, attempt))))
    return out


def in_flight(markers: Path | str, *, alive_only: bool = False) -> list[Attempt]:
    """Attempts begun and not ended; ``alive_only``: only those of processes still alive
    (an attempt of a killed worker never ends)."""
    return [
        a for a in attempts(markers) if a.outcome is None and (not alive_only or pid_alive(a.pid))
    ]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- reconciling from the server's log -----------------------------------------------------
def decide_from_log(run_id: str, server: DeliveryServer, *, store: Any = None) -> Counter[str]:
    """Decide every unknown effect of ``run_id`` from the server's log; returns the counts
    of decisions (``applied`` / ``not_applied``). The server settles first (bytes a dead
    client left in a socket are still delivered)."""
    server.settle()
    assert server.log_path is not None, "decisions are taken from the server's log"
    log = read_log(server.log_path)
    decided: Counter[str] = Counter()
    decisions = unknowns_decided_from(
        log, run_id, store=store,
        applied_note="the server's log has delivery #{seq} under this key",
        not_applied_note="the server's log has nothing under this key",
    )  # fmt: skip
    for unknown, received in decisions:
        key = str(unknown.key)
        assert unknown.tool == TOOL, unknown
        assert unknown.step_key.startswith("item-"), unknown.step_key
        assert len(received) <= 1, f"{key} was delivered {len(received)} times"
        decided["applied" if received else "not_applied"] += 1
    return decided
