"""Taking a run over: the one transaction behind ``kx.resume``, ``%agent resume``, the
command line and a kernel that finds a ``%%agent`` run whose owner is gone.

In one transaction: the lease is checked (a live owner elsewhere refuses), the run's
ownership epoch goes up by one (``runs.owner_epoch``: from its commit on, every write the
previous owner still makes for the run is refused, ``OwnershipLost``), the run moves to
``running`` owned by this process with a fresh lease, steps left ``running`` become
``abandoned``, ``pending`` effects become ``unknown``, and if any effect is ``unknown`` the
run moves on to ``needs_decision``. Then the probes of the unknown effects
(``@kx.effect(probe=...)``) ask the external system; when they settle every one, the run is
taken over again and goes on; otherwise a person reconciles before anything runs.

Probes are not asked in a take-over from an owner that is not known to be gone (the run was
live and its owner is alive or cannot be told from here: a frozen agent process, another
host, a lapsed lease). That owner may still be inside the call, so the probe's "has not
arrived" would read as "not applied" and the call would be made twice. The unknowns wait
for a person, the reason says "the previous owner ... may still be making this call", and a
later resume asks their probes once ``PROBE_GRACE_SECONDS`` have passed since that
take-over (the keys are in its ``needs_decision`` event, ``probes_deferred``).

``run.map`` items in other processes outlive the owner that sent them, inside their calls
for as long as a call takes. No probe is asked for an unknown call of an item whose worker
still renews its heartbeat (``_store/heartbeats.py``), whatever the grace period says; the
probe is asked by the first resume after that attempt ended (its heartbeat lapsed).

A stop of a live run whose owner is gone (``lease.owner_gone``) is honoured at once by
:func:`stop_gone_owner`: nobody is left to reach a safe point, so the run is fenced and
cleaned as a take-over does it (the epoch goes up, steps left running are abandoned,
pending effects become unknown), and it moves to ``suspended`` (a user's stop, with who
and where), or to ``needs_decision`` when an effect's outcome is unknown.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from typing import Any, NamedTuple

from ..._formatting import duration_text
from ..._store import Store, actor
from ..._store.restart import superseded_error
from ...errors import OwnershipLost
from ...status import LIVE, RESUMABLE, Reason, Status
from ..batch.remote import ITEMS_DISPATCHED
from ..ledger.probes import settle_unknowns
from ..process.lease import check_takeover, lease_until, owner_alive, owner_gone

__all__ = ["PROBE_GRACE_SECONDS", "TakeOver", "stop_gone_owner", "take_over"]

PROBE_GRACE_SECONDS = 60.0  # an unknown effect is probed only once this old (see above)


class TakeOver(NamedTuple):
    """``status`` after the take-over (``running``, ``needs_decision``, or what the run
    was when it could not be taken over); ``unknown``: keys of effects a person decides;
    ``epoch``: the ownership epoch this process now holds (None: not taken over)."""

    status: str
    unknown: list[Any]
    epoch: int | None = None
    previous_owner: str | None = None  # taken from an owner maybe still alive: no probes

    @property
    def ok(self) -> bool:
        return self.status in (Status.RUNNING, Status.NEEDS_DECISION)


def take_over(
    store: Store,
    run_id: str,
    source: str,
    *,
    reason: str | None = None,
    fingerprint: str | None = None,
) -> TakeOver:
    """Make this process the owner of run ``run_id`` (see the module docstring).

    Raises ``RunStateError`` while another live process owns the run (``lease``).
    ``fingerprint``: the code that continues the run (agent runs), recorded on the run.
    """
    me = actor()

    def job(tx: Any) -> TakeOver:
        doubtful = _doubtful_owner(store, tx, run_id, me)
        running_elsewhere = sorted(store.live_item_keys_tx(tx, run_id))
        # A run a restart superseded (a failed one stays failed) never goes on itself.
        superseded_error(run_id, store.children_tx(tx, run_id), "resume")
        fields: dict[str, Any] = {
            "stop_requested_at": None,
            "stop_source": None,
            "owner": me,
            "lease_until": lease_until(store.now()),
        }
        if fingerprint is not None:
            fields["fingerprint"] = fingerprint
        result = store.transition_tx(
            tx,
            run_id,
            Status.RUNNING,
            RESUMABLE,
            kind="resumed",
            source=source,
            who=me,
            reason=reason,
            fields=fields,
        )
        if not result.ok:
            return TakeOver(str(result.before), [])
        # After the move (a refused one changes nothing): what a previous owner journaled
        # is folded under its epoch first, so its intents are seen as pending just below.
        epoch = store.advance_epoch_tx(tx, run_id)
        store.abandon_running_steps(tx, run_id)
        fresh = store.mark_pending_unknown(tx, run_id)
        unknown = list(store.unknown_keys_tx(tx, run_id))
        if not unknown:
            return TakeOver(Status.RUNNING, [], epoch)
        return _needs_decision_tx(
            store, tx, run_id, epoch, unknown, fresh, doubtful, running_elsewhere
        )

    result: TakeOver = store.write(job)
    if result.epoch is not None:
        store.hold_epoch(run_id, result.epoch)
    # Before a person is asked: the probes of unknown effects ask the external system;
    # never while the previous owner may still be inside the call, nor, for the grace
    # period, for the effects an earlier such take-over left unknown.
    settled = (
        result.status == Status.NEEDS_DECISION
        and result.previous_owner is None
        and settle_unknowns(run_id, store, skip=_held_back(store, run_id))
    )
    if settled and not store.open_unknowns(run_id):  # every unknown answered by its probe
        result = store.write(job)
        if result.epoch is not None:
            store.hold_epoch(run_id, result.epoch)
    return result


def stop_gone_owner(
    store: Store,
    run_id: str,
    *,
    source: str,
    who: str | None = None,
    epoch: int | None = None,
) -> str | None:
    """Stop run ``run_id`` at once if its owner is gone (``lease.owner_gone``, checked with
    the row locked); the status after, or None when its owner is not gone (an ordinary
    stop request is then the way). ``epoch``: the owner epoch the person saw; a run taken
    over since raises ``OwnershipLost`` and nothing changes.

    The previous owner is fenced as a take-over fences it: what it journaled is folded
    under its epoch, the epoch goes up, its steps left running become ``abandoned`` and
    its ``pending`` effects ``unknown``. Nothing is probed: a person decides the unknowns
    (``needs_decision``; their keys wait ``PROBE_GRACE_SECONDS`` when the owner is on a
    host that cannot be asked), and a run with none is ``suspended`` by the stop."""

    def job(tx: Any) -> str | None:
        current = store.lease_tx(tx, run_id)
        if current is None or not owner_gone(current, store.now()):
            return None
        if epoch is not None and current["owner_epoch"] not in (None, epoch):
            raise OwnershipLost(
                run_id,
                owner=current["owner"],
                epoch=current["owner_epoch"],
                held=epoch,
                what="stop",
            )
        previous = str(current["owner"])
        store.advance_epoch_tx(tx, run_id)
        store.abandon_running_steps(tx, run_id)
        fresh = store.mark_pending_unknown(tx, run_id)
        unknown = list(store.unknown_keys_tx(tx, run_id))
        doubtful = owner_alive(previous) is None or workers_maybe_in_calls(tx, run_id)
        detail: dict[str, Any] = {"previous_owner": previous, "owner_gone": True}
        fields = {"stop_requested_at": store.now(), "stop_source": source}
        if not unknown:
            store.transition_tx(
                tx,
                run_id,
                Status.SUSPENDED,
                LIVE,
                kind=Status.SUSPENDED,
                source=source,
                who=who,
                reason=Reason.USER_STOP,
                detail=detail,
                fields=fields,
            )
            return str(Status.SUSPENDED)
        why = (
            f"stopped while its process ({previous}) was gone; "
            f"{len(unknown)} effect(s) with unknown outcome"
        )
        detail.update(
            new_unknowns=len(fresh),
            probes_deferred=[str(k) for k in fresh] if doubtful else [],  # as take_over
        )
        store.transition_tx(
            tx,
            run_id,
            Status.NEEDS_DECISION,
            LIVE,
            kind=Status.NEEDS_DECISION,
            source=source,
            who=who,
            reason=why,
            detail=detail,
            fields=fields,
        )
        return str(Status.NEEDS_DECISION)

    result: str | None = store.write(job)
    return result


def _doubtful_owner(store: Store, tx: Any, run_id: str, me: str) -> str | None:
    """The run's owner when it may still be inside a call (None: it cannot be); raises
    ``RunStateError`` while another live process holds the lease."""
    current = store.lease_tx(tx, run_id)  # checked and taken in one transaction
    doubtful: str | None = None  # an owner that may still be inside a call
    if current is not None:
        check_takeover(current, store.now())
        owner = current.get("owner")
        if current["status"] in LIVE and owner and owner != me and owner_alive(owner) is not False:
            doubtful = str(owner)
        if doubtful is None and owner and workers_maybe_in_calls(tx, run_id):
            doubtful = f"{owner} (its run.map items on other processes)"
    return doubtful


def _needs_decision_tx(
    store: Store,
    tx: Any,
    run_id: str,
    epoch: int,
    unknown: list[Any],
    fresh: list[Any],
    doubtful: str | None,
    running_elsewhere: list[Any],
) -> TakeOver:
    """The taken-over run has unknown outcomes: ``needs_decision``, saying why."""
    why = f"{len(unknown)} effect(s) with unknown outcome"
    if doubtful and fresh:
        why += (
            f"; the previous owner {doubtful} may still be making this call, so no probe "
            f"was asked (a resume after {duration_text(PROBE_GRACE_SECONDS)} asks them)"
        )
    if running_elsewhere:
        why += (
            f"; {len(running_elsewhere)} run.map item(s) are still running in a worker "
            "process (their heartbeat is fresh), so their calls are not probed until "
            "those attempts end"
        )
    store.transition_tx(
        tx,
        run_id,
        Status.NEEDS_DECISION,
        (Status.RUNNING,),
        kind=Status.NEEDS_DECISION,
        source="ledger",
        reason=why,
        detail={
            "new_unknowns": len(fresh),
            "previous_owner": doubtful,
            "probes_deferred": [str(k) for k in fresh] if doubtful else [],
            "items_running_elsewhere": running_elsewhere,
        },
    )
    return TakeOver(Status.NEEDS_DECISION, unknown, epoch, doubtful)


def workers_maybe_in_calls(tx: Any, run_id: str) -> bool:
    """The owner being taken over sent ``run.map`` items to other processes: their workers
    outlive it (a dead notebook, a forced stop cancels only the futures) and may still be
    inside the calls its pending intents stand for, so no probe is asked for them yet."""
    row = tx.fetchone(
        "SELECT max(CASE WHEN kind = ? THEN id END), max(CASE WHEN kind = 'resumed' THEN id END)"
        " FROM events WHERE run_id = ? AND kind IN (?, 'resumed')",
        (ITEMS_DISPATCHED, run_id, ITEMS_DISPATCHED),
    )
    if row is None or row[0] is None:
        return False
    return row[1] is None or int(row[0]) > int(row[1])


def _held_back(store: Store, run_id: str) -> set[str]:
    """Keys of unknown effects no probe is asked for now: those an earlier take-over
    deferred (``_deferred``), and every unknown call of an item a worker process is still
    running (its step's heartbeat is fresh, ``_store/heartbeats.py``): that worker may be
    inside the call, however long it takes."""
    live = store.live_item_keys(run_id)
    in_live_items = {
        str(row["key"]) for row in store.open_unknowns(run_id) if row["step_key"] in live
    }
    return _deferred(store, run_id) | in_live_items


def _deferred(store: Store, run_id: str) -> set[str]:
    """Keys of effects a take-over from an owner maybe still alive made unknown less than
    ``PROBE_GRACE_SECONDS`` ago: that owner may still be inside their calls."""
    since = store.now() - dt.timedelta(seconds=PROBE_GRACE_SECONDS)
    rows = store.read(
        "SELECT detail FROM events WHERE run_id = ? AND kind = ? AND occurred_at > ?",
        (run_id, str(Status.NEEDS_DECISION), since),
    )
    keys: set[str] = set()
    for (detail,) in rows:
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            loaded = json.loads(detail) if isinstance(detail, str) else detail
            keys.update(str(k) for k in loaded.get("probes_deferred") or ())
    return keys
