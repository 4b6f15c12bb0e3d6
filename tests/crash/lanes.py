"""What the crash tests that kill chains of runs in lanes share: the lanes run at once, each
with a delivery server of its own, their tallies added up, the delivery log read at the
end, and each run's final checks on the store."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from support.http_server import DeliveryServer, read_log

from . import open_checked

__all__ = ["added_up", "chains_added_up", "delivery_log", "each_run_checked", "in_chains"]

T = TypeVar("T")
R = TypeVar("R")


def added_up(tallies: Sequence[T]) -> T:
    """The lanes' tallies (dataclasses of counts, Counters and lists) added up, field by
    field."""
    total = type(tallies[0])()
    for lane in tallies:
        for field in dataclasses.fields(total):  # type: ignore[arg-type]
            mine, theirs = getattr(total, field.name), getattr(lane, field.name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            else:
                setattr(total, field.name, mine + theirs)
    return total


def in_chains(
    folder: Path,
    chains: int,
    kills: int,
    chain: Callable[[int, int, Path, Any], None],
    **server_options: Any,
) -> None:
    """``chain(lane, its_kills, its_folder, its_server)`` for ``chains`` lanes at once, each
    with a folder and a delivery server of its own (no dedupe: a duplicate would show) and
    its share of ``kills``, rounded up; the first failure, in lane order, is raised."""
    share = -(-kills // chains)
    with contextlib.ExitStack() as servers, ThreadPoolExecutor(chains) as lanes:
        running = []
        for lane in range(chains):
            own = folder / f"lane-{lane}"
            own.mkdir()
            log_path = own / "deliveries.jsonl"
            server = servers.enter_context(DeliveryServer(log_path=log_path, **server_options))
            assert not server.dedupe, "duplicates must be visible"
            running.append(lanes.submit(chain, lane, share, own, server))
        for future in running:
            future.result()


def chains_added_up(
    folder: Path,
    chains: int,
    kills: int,
    tally: type[T],
    chain: Callable[[int, int, Path, DeliveryServer, T], None],
    **server_options: Any,
) -> T:
    """``chain(lane, its_kills, its_folder, its_server, its_tally)`` for ``chains`` lanes
    at once (see ``in_chains``), each counting into a ``tally()`` of its own; the tallies
    added up."""
    tallies = [tally() for _ in range(chains)]

    def lane_chain(lane: int, share: int, own: Path, server: DeliveryServer) -> None:
        chain(lane, share, own, server, tallies[lane])

    in_chains(folder, chains, kills, lane_chain, **server_options)
    return added_up(tallies)


def delivery_log(server: DeliveryServer) -> list[dict[str, Any]]:
    """The server's JSON-lines log, which holds every delivery the server counted."""
    log = read_log(server.log_path or "")
    assert len(log) == len(server.deliveries)
    return log


def each_run_checked(
    store_path: Path, runs: Sequence[str], check: Callable[[Any, str], R], query: str | None = None
) -> list[R]:
    """``check(store, run_id)`` of every run, on the store opened as a user would after a
    crash (see ``open_checked``)."""
    store = open_checked(store_path, query)
    try:
        return [check(store, run_id) for run_id in runs]
    finally:
        store.close()
