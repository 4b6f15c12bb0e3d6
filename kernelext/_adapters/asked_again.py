"""What identifies a model's turn in the ledger: its conversation, not its instructions.

A model call's request holds the instructions (a system prompt, an agent's
``instructions``) and the conversation (the user's messages, the model's answers, the tool
calls and their results). The agent's code computes the instructions again in every run and
resume (today's date, the user's name, a rule changed since), so they are no part of the
call's identity: its hash is of the conversation only, and a turn replayed with other
instructions goes on, noted (an ``instructions_changed`` event of the run and a warning in
the ``kernelext`` log), never refused. A different conversation is refused as any changed
call is (``EffectArgumentsMismatch``). The instructions are recorded with the call all the
same (``effects.args``): a person reads what the model was told.

A call recorded when its hash was of the whole request (before instructions were left out)
is replayed too. A call a person decided "it happened" without giving its answer
(``kx.reconcile``'s ``mark_applied()``) has no answer to replay: the model is asked again
under the same key and its answer recorded.
"""

from __future__ import annotations

import json
import logging
import uuid
import weakref
from collections.abc import Mapping
from typing import Any

from .._core.encoding.keys import hash_for
from .._core.engine.run_engine import RunEngine
from .._core.ledger.effect import Effect
from .._core.ledger.effect_outcomes import _PERFORM
from ..status import EffectStatus

__all__ = ["INSTRUCTIONS_CHANGED", "AskedAgain", "TurnAnswer", "split_request"]

INSTRUCTIONS_CHANGED = "instructions_changed"  # the event: detail {"tool", "step"}
_log = logging.getLogger("kernelext")
_NOTED: weakref.WeakSet[Any] = weakref.WeakSet()  # run engines told once already
# A model API's request: Anthropic's ``system``, the Responses API's ``instructions``, and
# the system and developer messages of its ``messages`` (chat) or ``input`` (Responses).
_INSTRUCTION_KEYS = ("system", "instructions")
_INSTRUCTION_ROLES = frozenset({"system", "developer"})
_CONVERSATION_KEYS = ("messages", "input")


class AskedAgain(Effect):
    """A model call whose instructions a resume asks again (see the module)."""

    _whole: tuple[tuple[Any, ...], dict[str, Any], int, dict[str, Any] | None] | None = None

    def split(self, named: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        """``named`` (the call's arguments by name, as given or as stored) as the
        conversation and the instructions."""
        raise NotImplementedError

    def _hashes(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        scheme: int,
        bound: dict[str, Any] | None,
    ) -> tuple[str, str | None]:
        self._whole = (args, kwargs, scheme, bound)
        kept = None if bound is None else self.split(bound)[0]
        return super()._hashes(args, self.split(kwargs)[0], scheme, kept)

    def _expected(
        self, run: RunEngine, key: uuid.UUID, row: dict[str, Any], digest: str, gated: bool
    ) -> str:
        expected = super()._expected(run, key, row, digest, gated)
        recorded = str(row["args_hash"])
        if (
            recorded != expected
            and self._whole is not None  # recorded when the whole request was hashed
            and hash_for(recorded, *super()._hashes(*self._whole)) == recorded
        ):
            return recorded
        return expected

    def _replay(self, run: RunEngine, key: uuid.UUID, row: dict[str, Any], *rest: Any) -> Any:
        out = super()._replay(run, key, row, *rest)
        if out is not None or row.get("status") != EffectStatus.APPLIED:
            return out
        # Decided "it happened" without the answer (kx.reconcile): nobody knows what the
        # model said, so it is asked again under the same key and its answer recorded.
        if not run.store.retry_intent(key, expected=EffectStatus.APPLIED):
            return super()._replay(run, key, run.store.effect(key) or row, *rest)
        return _PERFORM

    def _intent_or_replay(
        self,
        run: RunEngine,
        key: uuid.UUID,
        slot: tuple[str, int | None, int],
        hashes: tuple[str, str | None],
        shown: str,
        gated: bool,
    ) -> tuple[uuid.UUID, bool, Any]:
        row = run.effects.get(key)
        out = super()._intent_or_replay(run, key, slot, hashes, shown, gated)
        if row is not None and not out[1] and row.get("args") != shown:
            self._note_changed(run, row, shown)
        return out

    def _note_changed(self, run: RunEngine, row: dict[str, Any], shown: str) -> None:
        """A replayed turn whose instructions differ from the recorded ones: noted, once
        per run and resume, and the run goes on with the current ones."""
        try:
            before = self.split(json.loads(str(row["args"])))[1]
            now = self.split(json.loads(shown))[1]
        except (TypeError, ValueError, AttributeError):
            return  # a record of another shape: nothing to compare
        engine = getattr(run, "base", run)  # the run, not the call site it is seen from
        if before == now or engine in _NOTED:
            return
        _NOTED.add(engine)
        text = (
            f"{self.tool} in {row['step_key']} of run {run.id!r} was recorded with other "
            "instructions (system prompt) than the agent gives now: the resume replays the "
            "recorded conversation and goes on with the current instructions"
        )
        run.store.record_event(
            run.id,
            INSTRUCTIONS_CHANGED,
            wait=False,
            source="engine",
            reason=text,
            detail={"tool": self.tool, "step": row["step_key"]},
        )
        _log.warning("kernelext: %s", text)


class TurnAnswer(AskedAgain):
    """A framework's model turn (``turns.record_turn``): called with ``request`` (the
    conversation and the tools) and ``instructions``."""

    def split(self, named: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        return {k: v for k, v in named.items() if k != "instructions"}, named.get("instructions")


def split_request(named: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """A model API's request (``kx.openai``, ``kx.anthropic``) as its conversation and its
    instructions (what ``_INSTRUCTION_KEYS`` and ``_INSTRUCTION_ROLES`` name)."""
    kept = {k: v for k, v in named.items() if k not in _INSTRUCTION_KEYS}
    told = {k: named[k] for k in _INSTRUCTION_KEYS if k in named}
    for key in _CONVERSATION_KEYS:
        items = named.get(key)
        if isinstance(items, list):
            kept[key] = [m for m in items if not _instruction(m)]
            said = [m for m in items if _instruction(m)]
            if said:
                told[key] = said
    return kept, told


def _instruction(item: Any) -> bool:
    return isinstance(item, Mapping) and item.get("role") in _INSTRUCTION_ROLES
