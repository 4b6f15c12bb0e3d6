"""What an effect call's outcome records (``applied`` with its result, ``failed``,
``unknown``; ``not_applied`` when a call made inside it waits for approval or was
rejected: ``effect_approval``), and what a call already in the ledger gives back on a
resume (its result, a decision to make, or the call made again). Shared by the sync and
async paths (``ledger``, ``ledger_async``); mixed into ``ledger.Effect``."""

from __future__ import annotations

import uuid
from typing import Any

from ..._formatting import step_label
from ...errors import (
    EffectArgumentsMismatch,
    EffectFailed,
    LedgerError,
    NeedsDecision,
    ResultNotStorable,
)
from ...status import EffectStatus
from ..encoding.canonical import Unencodable
from ..encoding.keys import load_result, stored_result
from ..encoding.secrets import scrubbed_excerpt
from ..engine.run_engine import RunEngine
from ..people.approval_extras import refuse_edit
from .effect_approval import EffectApproval
from .retries import held_on_resume

__all__ = ["EffectOutcomes"]

_PERFORM = object()


def _describe(exc: BaseException) -> str:
    """The error text stored for a failed call: scrubbed, then cut (never the other way
    round, which could leave the start of a secret behind)."""
    return scrubbed_excerpt(f"{type(exc).__name__}: {exc}", 2000)


class EffectOutcomes(EffectApproval):
    """A call's outcome, recorded; a recorded call, replayed."""

    resumable: bool
    retry: bool
    dedupes: bool  # its target dedupes on the key (set by Effect)

    def _retry(self, run: RunEngine, row: dict[str, Any], gated: bool) -> bool:
        """Make a decided call again under its key; a gated one needs a new approval
        (unless it never returned: ``_still_approved``). False: another attempt of the step
        took the call again first (not made here)."""
        key = row["key"]
        if gated and not self._still_approved(run, row):
            for _ in range(2):
                grant = self._approval(run, row)
                if (run.store.approval(grant) or {}).get("edit") is not None:
                    raise refuse_edit(self.tool, grant, again=True)
                with run.force.critical():
                    if run.store.consume_approval(grant, run.id):
                        break
            else:
                raise LedgerError(f"The approval of {self.tool} (key {key}) could not be used.")
        return run.store.retry_intent(key, expected=str(row["status"]))

    def _replay_taken(self, run: RunEngine, key: uuid.UUID, digest: str, gated: bool) -> Any:
        """The call was taken again by another attempt of the same step (an executor ran
        the item twice at once): what the ledger says now, never a second call."""
        fresh = run.store.effect(key)
        if fresh is None or fresh["status"] in (EffectStatus.PENDING, EffectStatus.UNKNOWN):
            raise NeedsDecision(
                f"Effect {self.tool} (key {key}) is being made again by another attempt of "
                f"this step (the item ran twice at once); it is not made a second time. "
                f"Resume the run once that attempt ended; an outcome nobody recorded is "
                f"listed by kx.reconcile({run.id!r})."
            )
        run.effects[key] = fresh
        return self._replay(run, key, fresh, digest, gated)

    def _failed(self, run: RunEngine, key: uuid.UUID, exc: BaseException) -> None:
        """The tool raised: ``failed``, with the error."""
        attempts = run.effects[key].get("attempts")
        run.store.write_outcome(key, EffectStatus.FAILED, error=_describe(exc), attempts=attempts)
        run.effects[key]["status"] = EffectStatus.FAILED
        run.notify("effect", (self.tool, key, EffectStatus.FAILED))

    def _not_reached(self, run: RunEngine, key: uuid.UUID, why: str) -> None:
        """Its body was left for a call made inside it that was not made (``left_inside``:
        it waits for approval, or was rejected): ``not_applied`` with ``why``, so that the
        resume makes it again under its key (durable before the suspension goes on)."""
        why = scrubbed_excerpt(why, 2000)  # a person's note may be long
        run.store.write_outcome(
            key,
            EffectStatus.NOT_APPLIED,
            error=why,
            attempts=run.effects[key].get("attempts"),
            wait=True,
        )
        run.effects[key].update(status=EffectStatus.NOT_APPLIED, error=why)
        run.notify("effect", (self.tool, key, EffectStatus.NOT_APPLIED))

    def _interrupted(self, run: RunEngine, key: uuid.UUID) -> None:
        """A forced stop, a cancellation (or the process going down) mid-call: nobody
        knows whether it happened, so ``unknown`` (durable before the stop goes on)."""
        run.store.write_outcome(
            key,
            EffectStatus.UNKNOWN,
            error="interrupted during the call",
            attempts=run.effects[key].get("attempts"),
            wait=True,
        )
        run.store.record_event(
            run.id,
            "effect_unknown",
            wait=False,
            source="engine",
            reason="interrupted during the call",
            detail={"key": str(key), "tool": self.tool},
        )
        run.effects[key]["status"] = EffectStatus.UNKNOWN
        run.notify("effect", (self.tool, key, EffectStatus.UNKNOWN))

    def _applied(self, run: RunEngine, key: uuid.UUID, result: Any) -> Any:
        """The tool returned ``result``: ``applied`` with it stored (else ``unknown``)."""
        try:
            encoded = stored_result(result)
        except (Unencodable, TypeError, ValueError) as exc:
            raise self._unstorable(run, key, result, exc) from None
        run.store.write_outcome(
            key, EffectStatus.APPLIED, result=encoded, attempts=run.effects[key].get("attempts")
        )
        run.effects[key].update(status=EffectStatus.APPLIED, result=encoded)
        run.notify("effect", (self.tool, key, EffectStatus.APPLIED))
        return result

    def _replay(
        self, run: RunEngine, key: uuid.UUID, row: dict[str, Any], digest: str, gated: bool
    ) -> Any:
        if row["args_hash"] != digest:
            raise EffectArgumentsMismatch(
                f"Effect key {key} ({self.tool}, call {row.get('call_ordinal')} of "
                f"{step_label(row.get('step_ordinal'), row.get('step_key'))} in run {run.id!r}) "
                "was first used with other "
                "arguments. A key stands for one call; the same step must make the same calls "
                'on resume. Restore the original arguments (the recorded call: kx.sql("select '
                f"args from effects where key = '{key}'\")). kx.restart does not help: it "
                "carries this applied call and stops here the same way. To make a different "
                "call deliberately, make it in a new step (another step key) or a new run."
            )
        status = row["status"]
        if status == EffectStatus.APPLIED:
            run.notify("effect", (self.tool, key, "replayed"))
            if row.get("result") is None and row.get("error"):
                # An earlier release left such a call applied without its result: a dead
                # end. Listed by kx.reconcile from now on, so that a person can decide it.
                note = f"applied, but its result was not stored ({row['error']})"
                run.store.mark_failed_unknown(key, note, status=EffectStatus.APPLIED)
                row["status"] = EffectStatus.UNKNOWN
                raise NeedsDecision(
                    f"Effect {self.tool} (key {key}) was {note}, so a resume cannot return "
                    f"it. Decide it with kx.reconcile({run.id!r}): mark_applied(result=...) "
                    "with the value it returned, or mark_not_applied() to make it again."
                )
            return load_result(row["result"]) if row.get("result") is not None else None
        if status in (EffectStatus.UNKNOWN, EffectStatus.PENDING):
            raise NeedsDecision(
                f"Effect {self.tool} (key {key}) has an unknown outcome. Decide it with "
                f"kx.reconcile({run.id!r}) before the run goes on."
            )
        if status == EffectStatus.NOT_APPLIED:
            if self._retry(run, {**row, "key": key}, gated):
                return _PERFORM
            return self._replay_taken(run, key, digest, gated)
        if status == EffectStatus.FAILED:
            if not self.resumable:
                # Listed by kx.reconcile from now on, so that it can be decided.
                run.store.mark_failed_unknown(
                    key, f"resumable=False call failed ({row.get('error')}); may have happened"
                )
                row["status"] = EffectStatus.UNKNOWN
                raise NeedsDecision(
                    f"Effect {self.tool} (key {key}) is declared resumable=False and failed "
                    f"before ({row.get('error')}); it may have half-happened. Decide it with "
                    f"kx.reconcile({run.id!r})."
                )
            if self.retry:
                held_on_resume(self, run, key, row)  # unknown if it may have reached its target
                if self._retry(run, {**row, "key": key}, gated):
                    return _PERFORM
                return self._replay_taken(run, key, digest, gated)
            raise EffectFailed(
                f"Effect {self.tool} (key {key}) failed before: {row.get('error')}. It is not "
                "retried silently. Declare @kx.effect(retry=True) to retry failed calls on resume."
            )
        raise LedgerError(f"Effect {self.tool} (key {key}) is {status}; the run cannot go on.")

    def _unstorable(
        self, run: RunEngine, key: uuid.UUID, result: Any, exc: Exception
    ) -> ResultNotStorable:
        """The call was made but its result cannot be stored: ``unknown`` (listed by
        ``kx.reconcile``), never an applied row a resume could not return."""
        kind = type(result).__name__
        why = str(exc) if isinstance(exc, Unencodable) else f"{type(exc).__name__}: {exc}"
        note = scrubbed_excerpt(f"applied, but its result (a {kind}) cannot be stored: {why}", 2000)
        run.store.write_outcome(key, EffectStatus.UNKNOWN, error=note, wait=True)
        run.store.record_event(
            run.id,
            "effect_unknown",
            wait=False,
            source="engine",
            reason=note,
            detail={"key": str(key), "tool": self.tool},
        )
        run.effects[key]["status"] = EffectStatus.UNKNOWN
        run.notify("effect", (self.tool, key, EffectStatus.UNKNOWN))
        return ResultNotStorable(
            f"Effect {self.tool} (key {key}) was applied, but its result, a {kind}, cannot be "
            f"stored ({why}), so a resume could not return it. The call is recorded as "
            f"unknown: decide it with kx.reconcile({run.id!r}) (mark_applied(result=...) with "
            "a value that can be stored). Make the tool return plain values (dict, list, str, "
            "numbers, datetime, Decimal, bytes, tuples, sets)."
        )
