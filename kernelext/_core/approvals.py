"""What a person does for a waiting run: approve or reject a call, answer a question.

``kx.approvals(run_id=None)`` lists the open approval requests (of effects declared
``@kx.effect(needs_approval=...)``), ``kx.questions(run_id=None)`` the open questions
(``run.ask``). Deciding or answering records who (the OS user), when and the note, in
the request's row and as an ``events`` row, then resumes the run when this process
runs it (the same as pressing Resume); a run of another process goes on at its next
``kx.resume``. In a notebook both lists display as widgets.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any, TypeVar

from .._store import Store, actor
from .._store.approvals import APPROVED, REJECTED, several_requests
from .._validate import (
    FLAG,
    NOTE,
    OPTIONAL_RUN_ID,
    RUN_ID,
    SOURCE,
    STORE,
    check_key,
    optional,
    validated,
)
from ..errors import LedgerError
from ..status import Reason, Status
from .asking import check_answer, encode_answer, parse_answer
from .codec import loads_json
from .runtime import get_store, runtime

__all__ = [
    "Approval",
    "Approvals",
    "Question",
    "Questions",
    "answer",
    "approvals",
    "approve",
    "find_approval",
    "questions",
    "reject",
    "resume_if_here",
    "time_left_text",
    "waiting_text",
]

_UNSET: Any = object()


def time_left_text(expires_at: dt.datetime | None, now: dt.datetime) -> str:
    """``"expires in 2 d 23 h"``, ``"expires in 41 min"``, ``"past its deadline"``."""
    if expires_at is None:
        return "no deadline"
    left = (expires_at - now).total_seconds()
    if left <= 0:
        return "past its deadline"
    days, rest = divmod(int(left), 86400)
    hours, rest = divmod(rest, 3600)
    if days:
        return f"expires in {days} d {hours} h"
    if hours:
        return f"expires in {hours} h {rest // 60} min"
    return f"expires in {max(rest // 60, 1)} min"


def waiting_text(run_id: str, reason: str | None) -> str | None:
    """What a run suspended for a person waits for, and what to do (None for other reasons)."""
    if reason == Reason.APPROVAL:
        return (
            f"run {run_id!r} waits for an approval: nothing was sent. Approve or reject it in "
            f"the run's panel, with kx.approvals({run_id!r}), or `kernelext approve ID`; then "
            "the run goes on (a %%agent cell: run it again)."
        )
    if reason == Reason.INPUT:
        return (
            f"run {run_id!r} waits for an answer: kx.answer({run_id!r}, value), the run's panel, "
            f"or `kernelext answer {run_id} VALUE`; then the run goes on (a %%agent cell: run "
            "it again)."
        )
    return None


def resume_if_here(store: Store, run_id: str, source: str) -> Any:
    """Resume ``run_id`` when this process runs it and it waits only for a person.

    Returns the new handle, or None when the run is another process's (its next
    ``kx.resume`` goes on), is not suspended for an approval or an answer, or still waits
    for another one.
    """
    row = store.find_run(run_id)
    if row is None or row["status"] != Status.SUSPENDED:
        return None
    if row["reason"] not in (Reason.APPROVAL, Reason.INPUT) or row.get("owner") != actor():
        return None
    now = store.now()
    if store.open_approvals(run_id, now) or store.open_inputs(run_id, now):
        return None
    live = runtime().live_handle(run_id)
    if live is not None:  # its worker is still recording the suspension
        live.wait(30)
    from .control import resume

    return resume(run_id, store=store, source=source)


# -- approvals ------------------------------------------------------------------------------
T = TypeVar("T")


class Approval:
    """One request to approve one call. Decide it with ``.approve()`` or ``.reject()``."""

    def __init__(self, store: Store, row: dict[str, Any]) -> None:
        self.store = store
        self.row = row
        self.id: uuid.UUID = row["id"]
        self.key: uuid.UUID = row["key"]
        self.run_id: str = row["run_id"]
        self.step: str = row["step"]
        self.tool: str = row["tool"]
        self.args: str | None = row["args"]  # redacted, as JSON text
        self.args_hash: str = row["args_hash"]
        self.requested_at: dt.datetime = row["requested_at"]
        self.expires_at: dt.datetime | None = row["expires_at"]
        self.decision: str | None = row["decision"]
        self.handle: Any = None  # the run's new handle once a decision resumed it

    @property
    def arguments(self) -> dict[str, Any]:
        """The call's arguments as stored (secrets redacted)."""
        decoded = json.loads(self.args) if self.args else {}
        return decoded if isinstance(decoded, dict) else {"args": decoded}

    @property
    def time_left(self) -> str:
        return time_left_text(self.expires_at, self.store.now())

    @validated("Approval.approve", note=NOTE, source=SOURCE, resume=FLAG)
    def approve(self, note: str | None = None, *, source: str = "api", resume: bool = True) -> Any:
        """Allow this one call, with these arguments, once. Resumes the run when this
        process runs it (returns its new handle); else its next ``kx.resume`` goes on."""
        return self._decide(APPROVED, note, source, resume)

    @validated("Approval.reject", note=NOTE, source=SOURCE, resume=FLAG)
    def reject(self, note: str | None = None, *, source: str = "api", resume: bool = True) -> Any:
        """Refuse the call: on resume the agent gets ``kx.EffectRejected`` at it."""
        return self._decide(REJECTED, note, source, resume)

    def _decide(self, decision: str, note: str | None, source: str, resume: bool) -> Any:
        note = (note or "").strip() or None
        self.row = self.store.decide_approval(
            self.id, decision, who=actor(), note=note, source=source
        )
        self.decision = decision
        if resume:
            self.handle = resume_if_here(self.store, self.run_id, source)
        return self.handle

    def describe(self) -> str:
        return (
            f"{self.tool}({self.args or ''}) run={self.run_id} step={self.step!r} "
            f"id={self.id} {self.time_left}"
        )

    def __repr__(self) -> str:
        if self.decision is not None:  # what was decided: these very arguments
            return (
                f"<approval request {self.id} {self.decision}: {self.tool}({self.args or ''}) "
                f"run={self.run_id} step={self.step!r}>"
            )
        return f"<approval request {self.describe()} open>"


class _Waiting(list[T]):
    """What waits for a person (of one run, or of every run); in a notebook it displays
    as cards with their buttons (``approvals_renderer``), elsewhere as ``text()``."""

    def __init__(self, run_id: str | None, store: Store, items: list[T]) -> None:
        super().__init__(items)
        self.run_id = run_id
        self.store = store

    def text(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        renderer = runtime().settings.approvals_renderer
        if renderer is None:
            return {"text/plain": self.text()}
        return renderer(self)


class Approvals(_Waiting[Approval]):
    """Open approval requests. In a notebook it displays as the approvals widget."""

    @property
    def open(self) -> list[Approval]:
        return [item for item in self if item.decision is None]

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
)
def approve(
    ident: str | uuid.UUID,
    *,
    note: str | None = None,
    store: Store | None = None,
    source: str = "api",
    resume: bool = True,
) -> Approval:
    """``kx.approve(ident)``: approve the request ``ident``, a request id or an effect key
    (whole, or a unique prefix of an open one; by key only while that key has had one
    request), as ``kernelext approve ID`` does. Records who, when and ``note``, resumes the
    run when this process runs it (``resume=False``: not), and returns the decided
    :class:`Approval`."""
    return _decide(ident, APPROVED, note, store, source, resume)


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
) -> Approval:
    store = get_store(store)
    row = store.decide_approval(
        find_approval(ident, store=store),
        decision,
        who=actor(),
        note=(note or "").strip() or None,
        source=source,
    )
    item = Approval(store, row)
    if resume:
        item.handle = resume_if_here(store, item.run_id, source)
    return item


# -- questions ---------------------------------------------------------------------------
class Question:
    """One open ``run.ask`` question. Answer it with ``.answer(value)``."""

    def __init__(self, store: Store, row: dict[str, Any]) -> None:
        self.store = store
        self.row = row
        self.key: uuid.UUID = row["key"]
        self.run_id: str = row["run_id"]
        self.step: str = row["step"]
        self.prompt: str = row["prompt"]
        self.schema: dict[str, Any] = json.loads(row["answer_schema"] or "{}")
        self.default: Any = (
            loads_json(row["default_answer"]) if row["default_answer"] is not None else None
        )
        self.asked_at: dt.datetime = row["asked_at"]
        self.expires_at: dt.datetime | None = row["expires_at"]
        self.answered = row["answered_at"] is not None
        self.handle: Any = None

    @property
    def time_left(self) -> str:
        return time_left_text(self.expires_at, self.store.now())

    def check(self, value: Any) -> None:
        """Raise ``ValueError`` (saying what fits) unless ``value`` answers the question."""
        try:
            check_answer(self.schema, value)
        except ValueError as exc:
            raise ValueError(
                f"Answer refused for {self.prompt!r} (run {self.run_id!r}): {exc} Nothing was "
                f"stored; answer again with a value that fits (schema {json.dumps(self.schema)})."
            ) from None

    @validated("Question.answer", note=NOTE, source=SOURCE, resume=FLAG)
    def answer(
        self,
        value: Any = _UNSET,
        *,
        note: str | None = None,
        source: str = "api",
        resume: bool = True,
    ) -> Any:
        """Store the answer (the default without ``value``) and resume the run when this
        process runs it (returns its new handle); else its next ``kx.resume`` goes on."""
        if value is _UNSET:
            if self.default is None:
                raise ValueError(f"The question {self.prompt!r} has no default: give a value.")
            value = self.default
        self.check(value)
        try:
            encoded = encode_answer(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"Question.answer(value=...) for {self.prompt!r} (run {self.run_id!r}) takes a "
                "value that can be stored as JSON: text, a number, True/False, None, or a "
                f"list or dict of those; not {type(value).__name__} ({exc}). Nothing was "
                "stored; answer again with such a value (e.g. str(value))."
            ) from None
        note = (note or "").strip() or None
        self.row = self.store.answer_input(self.key, encoded, who=actor(), note=note, source=source)
        self.answered = True
        if resume:
            self.handle = resume_if_here(self.store, self.run_id, source)
        return self.handle

    def answer_text(self, text: str, **kwargs: Any) -> Any:
        """Answer with typed text, read as the schema asks (a number, true/false, JSON)."""
        return self.answer(parse_answer(self.schema, text), **kwargs)

    def describe(self) -> str:
        return (
            f"{self.prompt!r} run={self.run_id} step={self.step!r} "
            f"schema={json.dumps(self.schema)} {self.time_left}"
        )

    def __repr__(self) -> str:
        return f"<question {self.describe()} {'answered' if self.answered else 'open'}>"


class Questions(_Waiting[Question]):
    """Open questions. In a notebook it displays as the questions widget."""

    def text(self) -> str:
        scope = f"Run {self.run_id}" if self.run_id else "All runs"
        if not self:
            return f"{scope}: no question waits."
        lines = [f"{scope}: {sum(not q.answered for q in self)} question(s) waiting"]
        lines += [f"  {q.describe()}" for q in self]
        lines.append("Answer each: .answer(value)  (or kx.answer(run_id, value))")
        return "\n".join(lines)


@validated("kx.questions", run_id=OPTIONAL_RUN_ID, store=STORE)
def questions(run_id: str | None = None, *, store: Store | None = None) -> Questions:
    """The questions (``run.ask``) waiting for an answer (of one run, or of every run)."""
    store = get_store(store)
    if run_id is not None:
        store.get_run(run_id)
    rows = store.open_inputs(run_id, store.now())
    return Questions(run_id, store, [Question(store, row) for row in rows])


@validated(
    "kx.answer",
    run_id=RUN_ID,
    key=optional(check_key),
    note=NOTE,
    text=FLAG,
    store=STORE,
    source=SOURCE,
    resume=FLAG,
)
def answer(
    run_id: str,
    value: Any = _UNSET,
    *,
    key: str | uuid.UUID | None = None,
    note: str | None = None,
    text: bool = False,
    store: Store | None = None,
    source: str = "api",
    resume: bool = True,
) -> Any:
    """Answer the open question of run ``run_id`` (``key`` picks one when several wait).

    The answer must fit the question's schema (else ``ValueError`` says what fits; nothing
    is stored). ``text=True``: ``value`` is typed text, read as the schema asks. Resumes
    the run when this process runs it and returns its new handle; else None.
    """
    store = get_store(store)
    open_ones = questions(run_id, store=store)
    if key is not None:
        wanted = str(key).strip().lower()
        open_ones = Questions(
            run_id, store, [q for q in open_ones if str(q.key).startswith(wanted)]
        )
    if len(open_ones) != 1:
        listing = "; ".join(f"{q.key}: {q.prompt!r}" for q in open_ones) or "none"
        raise LedgerError(
            f"Run {run_id!r} has {len(open_ones)} open question(s) "
            + ("matching that key " if key is not None else "")
            + f"({listing}); "
            + ("pass key=... to pick one." if open_ones else "nothing to answer.")
        )
    question = open_ones[0]
    if text:
        if value is _UNSET:
            raise ValueError("answer(..., text=True) needs the typed text as value.")
        return question.answer_text(str(value), note=note, source=source, resume=resume)
    return question.answer(value, note=note, source=source, resume=resume)
