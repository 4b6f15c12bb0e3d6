"""Approvals of effect calls: requesting one, listing the open ones, deciding them.

A call of an effect declared ``@kx.effect(needs_approval=...)`` asks for approval
(:func:`approval_for_call`) and suspends the run (reason ``approval``) before anything is
sent. ``kx.approvals(run_id=None)`` lists the open requests; deciding one records who
(the OS user), when and the note, in the request's row and as an ``events`` row, then
resumes the run when this process runs it (the same as pressing Resume); a run of
another process goes on at its next ``kx.resume``. In a notebook the list displays as
widgets. The SQL is in ``_store/approvals.py``; questions are in ``questions.py``.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import TYPE_CHECKING, Any

from ..._formatting import duration_text, moment_text, step_label
from ..._shown import shows
from ..._store import Store, actor
from ..._store.approvals import APPROVED, NO_SUCH_REQUEST, REJECTED, SEVERAL_REQUESTS
from ..._validate import (
    FLAG,
    NOTE,
    OPTIONAL_RUN_ID,
    SOURCE,
    STORE,
    check_key,
    validated,
)
from ...errors import EffectRejected, LedgerError
from ...status import Reason
from ..encoding import data_args
from ..encoding.data_args import DataArgument, DataDiff, compact_text
from ..process.runtime import get_store, runtime
from .approval_extras import check_edit, decision_extras
from .waiting import Waiting, go_on, wait_for_person

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine

__all__ = [
    "Approval",
    "Approvals",
    "approval_for_call",
    "approvals",
    "approve",
    "decide_request",
    "find_approval",
    "refusal",
    "reject",
    "several_requests",
    "stamp",
    "time_left_text",
]


def time_left_text(expires_at: dt.datetime | None, now: dt.datetime) -> str:
    """``"expires in 2 d 23 h"``, ``"expires in 41 min"``, ``"past its deadline"``."""
    if expires_at is None:
        return "no deadline"
    left = (expires_at - now).total_seconds()
    if left <= 0:
        return "past its deadline"
    return f"expires in {duration_text(left)}"


def stamp(value: Any) -> str:
    """A stored time as a person reads it in a refusal: ``2026-11-02 14:03:00 UTC``."""
    return moment_text(value) if isinstance(value, dt.datetime) else str(value)


# -- requesting: a gated call of an effect ----------------------------------------------------
def approval_for_call(run: RunEngine, tool: str, row: dict[str, Any]) -> Any:
    """The id of the approved request for this very call (``row``: the intent of call
    ``tool``, with its key and argument hash).

    Otherwise the run suspends here (reason ``approval``) before anything is sent:
    after recording a request when none is open for these arguments, or again while
    the open one waits. A rejected request raises ``EffectRejected``.
    """
    store, key = run.store, row["key"]
    now = store.now()
    waiting = f"{tool} waits for approval: kx.approvals({run.id!r})"
    current = store.current_approval(key)
    if current is not None and current["args_hash"] == row["args_hash"]:
        if current["decision"] == REJECTED:
            note = current["note"]
            raise EffectRejected(
                f"{tool} (key {key}) was rejected by {current['actor']}"
                + (f": {note}" if note else "")
                + ". The call was not made. Catch kx.EffectRejected in the agent to take "
                "another path (an LLM agent can tell the model the user declined).",
                key=str(key),
                tool=tool,
                note=note,
            )
        expires = current["expires_at"]
        if expires is None or expires > now:
            if current["decision"] == APPROVED:
                return current["id"]
            wait_for_person(run, Reason.APPROVAL, expires, waiting)
    deadline = runtime().settings.expiry.deadline(Reason.APPROVAL, now)
    with run.force.critical():
        store.request_approval(
            {
                "key": key,
                "run_id": run.id,
                "step": row["step_key"],
                "step_ordinal": row.get("step_ordinal"),
                "call_ordinal": row["call_ordinal"],
                "tool": tool,
                "args_hash": row["args_hash"],
                "args": row.get("args"),
                "expires_at": deadline,
            }
        )
    run.notify("approval", (tool, key, "requested"))
    wait_for_person(run, Reason.APPROVAL, deadline, waiting)


# -- deciding ---------------------------------------------------------------------------------
def decide_request(
    store: Store,
    ident: uuid.UUID,
    decision: str,
    *,
    who: str,
    note: str | None,
    source: str = "api",
    unseen: bool = False,
    edit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Approve or reject request ``ident`` (its id, or an effect key with one request);
    returns the decided row. Any decision that cannot be made raises ``LedgerError``
    saying why and what to do instead; nothing changes then. A request with data too large
    to show is approved only with ``unseen=True``, which its event records; ``edit``: the
    call is made with these arguments changed (``approval_extras``)."""
    detail, edited = decision_extras(store, ident, decision, unseen, edit)
    result = store.decide_approval(
        ident, decision, who=who, note=note, source=source, detail=detail, edit=edited
    )
    if result.refused is None and result.row is not None:
        return result.row
    if result.refused == NO_SUCH_REQUEST or result.row is None:
        raise LedgerError(
            f"No approval request with id or effect key {ident} in the store at "
            f"{store.location}. List the open ones with kx.approvals() (or "
            "`kernelext approvals`)."
        )
    if result.refused == SEVERAL_REQUESTS:
        raise LedgerError(several_requests(result.row, list(result.ids)))
    raise LedgerError(refusal(result.row, store.now()))


def several_requests(row: dict[str, Any], ids: list[Any]) -> str:
    """Why a decision by effect key is refused once that key has had several requests."""
    return (
        f"Effect key {row['key']} ({row['tool']} in run {row['run_id']!r}) has had "
        f"{len(ids)} approval requests ({', '.join(str(i) for i in ids)}): its arguments "
        "changed between them, so the key does not say which call you saw. Decide by request "
        f"id (the newest, {ids[-1]}, has arguments {compact_text(row['args'])}); see "
        f"kx.approvals({row['run_id']!r}) or `kernelext approvals`."
    )


def refusal(row: dict[str, Any], now: dt.datetime) -> str:
    """Why the approval request ``row`` cannot be decided now, and what to do instead."""
    what = f"Approval {row['id']} ({row['tool']} in run {row['run_id']!r}, key {row['key']})"
    listing = f"See the open requests with kx.approvals({row['run_id']!r})."
    if row["consumed_at"] is not None:
        return (
            f"{what} was approved and its call used it at {stamp(row['consumed_at'])}; an "
            "approval allows one call. A new call of the effect asks again. " + listing
        )
    if row["superseded_at"] is not None:
        return (
            f"{what} was replaced at {stamp(row['superseded_at'])} by a newer request for the "
            "same call (its arguments changed, or the request expired). Decide the newer "
            "one. " + listing
        )
    if row["decision"] is not None:
        return (
            f"{what} was already {row['decision']} by {row['actor']} at "
            f"{stamp(row['decided_at'])}; a request is decided once. " + listing
        )
    if row["expires_at"] is not None and row["expires_at"] <= now:
        return (
            f"{what} expired at {stamp(row['expires_at'])} with its run's deadline and can no "
            f"longer be decided. kx.restart({row['run_id']!r}) starts a new run from its "
            "snapshot, which asks again."
        )
    return f"{what} cannot be decided now. " + listing


# -- kx.approvals -----------------------------------------------------------------------------
class Approval:
    """One request to approve one call. Decide it with ``.approve()`` or ``.reject()``."""

    def __init__(self, store: Store, row: dict[str, Any]) -> None:
        self.store = store
        self.row = row
        self.id: uuid.UUID = row["id"]
        self.key: uuid.UUID = row["key"]
        self.run_id: str = row["run_id"]
        self.step: str = row["step"]
        self.step_ordinal: int | None = row.get("step_ordinal")
        self.tool: str = row["tool"]
        self.args: str | None = row["args"]  # redacted, as JSON text, data with every value
        self.args_hash: str = row["args_hash"]
        self.requested_at: dt.datetime = row["requested_at"]
        self.expires_at: dt.datetime | None = row["expires_at"]
        self.decision: str | None = row["decision"]
        self.edited_args: str | None = row.get("edited_args")  # approved with edits: the call
        self.handle: Any = None  # the run's new handle once a decision resumed it

    @property
    def arguments(self) -> dict[str, Any]:
        """The call's arguments as stored (secrets redacted)."""
        decoded = json.loads(self.args) if self.args else {}
        return decoded if isinstance(decoded, dict) else {"args": decoded}

    @property
    def data(self) -> dict[str, DataArgument]:
        """Its data arguments (arrays, tables) by name, each with every row as stored."""
        return data_args.data_arguments(self.arguments)

    @property
    def previous(self) -> Approval | None:
        """The previously approved request of the same tool (any run), if any."""
        row = self.store.previous_approval(self.tool, self.requested_at)
        return Approval(self.store, row) if row is not None else None

    @property
    def changes(self) -> list[DataDiff]:
        """How each data argument differs from the previously approved call of the tool."""
        previous = self.previous
        return data_args.changes(previous.args, self.args) if previous is not None else []

    @property
    def time_left(self) -> str:
        return time_left_text(self.expires_at, self.store.now())

    @validated(
        "Approval.approve", note=NOTE, source=SOURCE, resume=FLAG, unseen=FLAG, edit=check_edit
    )
    def approve(
        self,
        note: str | None = None,
        *,
        source: str = "api",
        resume: bool = True,
        unseen: bool = False,
        edit: dict[str, Any] | None = None,
    ) -> Any:
        """Allow this one call, with these arguments, once. Resumes the run when this
        process runs it (returns its new handle); else its next ``kx.resume`` goes on.
        ``unseen=True``: approve data too large to show, knowingly (recorded);
        ``edit={"amount": 100}``: the call is made with these arguments changed."""
        return self._decide(APPROVED, note, source, resume, unseen=unseen, edit=edit)

    @validated("Approval.reject", note=NOTE, source=SOURCE, resume=FLAG)
    def reject(self, note: str | None = None, *, source: str = "api", resume: bool = True) -> Any:
        """Refuse the call: on resume the agent gets ``kx.EffectRejected`` at it."""
        return self._decide(REJECTED, note, source, resume)

    def _decide(
        self, decision: str, note: str | None, source: str, resume: bool, **extras: Any
    ) -> Any:
        note = (note or "").strip() or None
        self.row = decide_request(
            self.store, self.id, decision, who=actor(), note=note, source=source, **extras
        )
        self.decision = decision
        if resume:
            self.handle = go_on(self.store, self.run_id, source)
        return self.handle

    @property
    def step_text(self) -> str:
        """``step 1``, ``step 2 (pay)``: the step of the call, as every surface shows it."""
        return step_label(self.step_ordinal, self.step)

    def describe(self) -> str:
        return (
            f"{self.tool}({compact_text(self.args)}) run={self.run_id} {self.step_text} "
            f"id={self.id} {self.time_left}"
        )

    @shows
    def __repr__(self) -> str:
        if self.decision is not None:  # what was decided: these very arguments
            edited = " with edits" if self.edited_args else ""
            return (
                f"<approval request {self.id} {self.decision}{edited}: {self.tool}"
                f"({compact_text(self.edited_args or self.args)}) "
                f"run={self.run_id} {self.step_text}>"
            )
        return f"<approval request {self.describe()} open>"


class Approvals(Waiting[Approval]):
    """Open approval requests. In a notebook it displays as the approvals widget."""

    @property
    def open(self) -> list[Approval]:
        return [item for item in self if item.decision is None]

    @shows
    def text(self) -> str:
        scope = f"Run {self.run_id}" if self.run_id else "All runs"
        if not self:
            return f"{scope}: no approval request waits."
        lines = [f"{scope}: {len(self.open)} approval request(s) waiting"]
        lines += [f"  {item.describe()} -> {item.decision or 'undecided'}" for item in self]
        lines.append("Decide each: .approve(note=...) or .reject(note=...)")
        return "\n".join(lines)


@validated("kx.approvals", run_id=OPTIONAL_RUN_ID, store=STORE)
def approvals(run_id: str | None = None, *, store: Store | None = None) -> Approvals:
    """The approval requests waiting for a decision (of one run, or of every run)."""
    store = get_store(store)
    if run_id is not None:
        store.get_run(run_id)  # RunNotFound names the store
    rows = store.open_approvals(run_id, store.now())
    return Approvals(run_id, store, [Approval(store, row) for row in rows])


def find_approval(ident: str | uuid.UUID, *, store: Store | None = None) -> uuid.UUID:
    """The id of the request named by ``ident``: a request id or an effect key, whole or a
    unique prefix of an open one (what ``kernelext approve KEY`` accepts)."""
    store = get_store(store)
    if isinstance(ident, uuid.UUID):
        return ident
    text = ident.strip().lower()
    try:
        return uuid.UUID(text)
    except ValueError:
        pass
    rows = store.open_approvals(None, store.now())
    matches = {row["id"] for row in rows if _named(row, text)}
    if not matches:  # decided, used or expired ones: the decision says why it is refused
        named = [row for row in store.approval_rows() if _named(row, text)]
        keys = {row["key"] for row in named}
        matches = keys if len(keys) == 1 else {row["id"] for row in named}  # one call: its key
    if len(matches) == 1:
        found: uuid.UUID = matches.pop()
        by_key = [r for r in rows if r["id"] == found and not str(r["id"]).startswith(text)]
        if by_key:  # named by its effect key: only while that key has had one request
            ids = [r["id"] for r in store.approval_rows(key=by_key[0]["key"])]
            if len(ids) > 1:
                raise LedgerError(several_requests(by_key[0], ids))
        return found
    shown = ", ".join(f"{row['id']} ({row['tool']}, run {row['run_id']})" for row in rows)
    if not matches:
        raise LedgerError(f"No approval request matches {ident!r}. Open ones: {shown or 'none'}.")
    raise LedgerError(f"{ident!r} matches several requests; give more of it. Open ones: {shown}.")


def _named(row: dict[str, Any], prefix: str) -> bool:
    return str(row["id"]).startswith(prefix) or str(row["key"]).startswith(prefix)


@validated(
    "kx.approve",
    ident=check_key,
    note=NOTE,
    store=STORE,
    source=SOURCE,
    resume=FLAG,
    unseen=FLAG,
    edit=check_edit,
)
def approve(
    ident: str | uuid.UUID,
    *,
    note: str | None = None,
    store: Store | None = None,
    source: str = "api",
    resume: bool = True,
    unseen: bool = False,
    edit: dict[str, Any] | None = None,
) -> Approval:
    """``kx.approve(ident)``: approve the request ``ident``, a request id or an effect key
    (whole, or a unique prefix of an open one; by key only while that key has had one
    request), as ``kernelext approve ID`` does. Records who, when and ``note``, resumes the
    run when this process runs it (``resume=False``: not), and returns the decided
    :class:`Approval`. ``unseen=True``: approve data too large to show (more than
    ``CELL_LIMIT`` cells), knowingly; its event records it (refused without).
    ``edit={"amount": 100}``: the call is made with these arguments changed; the request
    keeps the original and the edited call, its event both."""
    return _decide(ident, APPROVED, note, store, source, resume, unseen=unseen, edit=edit)


@validated(
    "kx.reject",
    ident=check_key,
    note=NOTE,
    store=STORE,
    source=SOURCE,
    resume=FLAG,
)
def reject(
    ident: str | uuid.UUID,
    *,
    note: str | None = None,
    store: Store | None = None,
    source: str = "api",
    resume: bool = True,
) -> Approval:
    """``kx.reject(ident)``: reject the request ``ident`` (named as for :func:`approve`);
    the agent gets ``kx.EffectRejected`` at that call. Returns the decided :class:`Approval`."""
    return _decide(ident, REJECTED, note, store, source, resume)


def _decide(
    ident: str | uuid.UUID,
    decision: str,
    note: str | None,
    store: Store | None,
    source: str,
    resume: bool,
    **extras: Any,
) -> Approval:
    store = get_store(store)
    row = decide_request(
        store,
        find_approval(ident, store=store),
        decision,
        who=actor(),
        note=(note or "").strip() or None,
        source=source,
        **extras,
    )
    item = Approval(store, row)
    if resume:
        item.handle = go_on(store, item.run_id, source)
    return item
