"""Human decisions on effects whose outcome is unknown."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from ..._formatting import moment_text, step_label
from ..._shown import shows
from ..._store import Store, actor
from ..._store.effects import GIVE_UP
from ..._validate import NOTE, RUN_ID, SOURCE, STORE, validated
from ...errors import SerializationError
from ...status import EffectStatus, Status
from ..encoding.canonical import Unencodable
from ..encoding.keys import stored_result
from ..process.runtime import get_store, runtime

__all__ = ["GIVE_UP", "Reconciliation", "UnknownEffect", "reconcile"]


class UnknownEffect:
    """One effect whose outcome nobody knows. Decide it with one of the three methods.

    ``decision`` is then ``applied``, ``not_applied`` (the status the effect got) or
    ``give_up`` (``GIVE_UP``).
    """

    def __init__(self, store: Store, row: dict[str, Any]) -> None:
        self.store = store
        self.row = row
        self.key: uuid.UUID = row["key"]
        self.run_id: str = row["run_id"]
        self.tool: str = row["tool"]
        self.step_key: str = row["step_key"]
        self.step_ordinal: int | None = row.get("step_ordinal")
        self.args: str | None = row["args"]
        self.intent_at: dt.datetime = row["intent_at"]
        self.decision: str | None = None
        # A worker process still renews the heartbeat of this call's run.map item: it may
        # be inside the call now (kx.reconcile sets it; _store/heartbeats.py).
        self.worker_running = False

    @property
    def step_text(self) -> str:
        """``step 2 (fetch)``: the step of the call, as every surface shows it."""
        return step_label(self.step_ordinal, self.step_key)

    @validated("UnknownEffect.mark_applied", note=NOTE, source=SOURCE)
    def mark_applied(
        self, result: Any = None, *, note: str | None = None, source: str = "api"
    ) -> None:
        """It happened. ``result`` is what the call returned, replayed on resume."""
        try:
            encoded = stored_result(result)
        except Unencodable as exc:
            raise SerializationError(
                f"The result given for {self.tool} (key {self.key}) cannot be stored ({exc}); "
                "pass a value a resume can return: plain JSON, datetime, Decimal, bytes, "
                "tuples, sets."
            ) from None
        self._decide(EffectStatus.APPLIED, encoded, note, source)

    @validated("UnknownEffect.mark_not_applied", note=NOTE, source=SOURCE)
    def mark_not_applied(self, *, note: str | None = None, source: str = "api") -> None:
        """It did not happen: the call is made again on resume, under the same key."""
        self._decide(EffectStatus.NOT_APPLIED, None, note, source)

    @validated("UnknownEffect.give_up", note=NOTE, source=SOURCE)
    def give_up(self, *, note: str | None = None, source: str = "api") -> None:
        """Abandon the run: it is cancelled and its claims released."""
        self._decide(GIVE_UP, None, note, source)

    def _decide(self, decision: str, result: str | None, note: str | None, source: str) -> None:
        self.store.decide_effect(
            self.key, decision, result=result, who=actor(), note=note, source=source
        )
        if decision == GIVE_UP:
            self.store.write(
                lambda tx: self.store.release_run_claims_tx(tx, self.run_id, Status.CANCELLED)
            )
        self.decision = decision

    @property
    def caution(self) -> str | None:
        """What a person should know before deciding, if anything."""
        if not self.worker_running:
            return None
        return (
            f"a worker process is still running {self.step_text} and may be inside this "
            "call: decide once it ended (a call marked not applied is made again on resume)"
        )

    @shows
    def __repr__(self) -> str:
        state = self.decision or EffectStatus.UNKNOWN
        return (
            f"<unknown effect {self.tool} key={self.key} {self.step_text} "
            f"intent={moment_text(self.intent_at)} {state}>"
        )


class Reconciliation(list[UnknownEffect]):
    """The open unknown effects of a run. In a notebook it displays as a widget."""

    def __init__(self, run_id: str, store: Store, items: list[UnknownEffect]) -> None:
        super().__init__(items)
        self.run_id = run_id
        self.store = store

    @property
    def open(self) -> list[UnknownEffect]:
        return [item for item in self if item.decision is None]

    @shows
    def text(self) -> str:
        if not self:
            return f"Run {self.run_id}: no effects with an unknown outcome."
        lines = [f"Run {self.run_id}: {len(self.open)} effect(s) with an unknown outcome"]
        for item in self:
            lines.append(
                f"  {item.tool}({item.args or ''}) key={item.key} {item.step_text} "
                f"intent {moment_text(item.intent_at)} -> {item.decision or 'undecided'}"
            )
            if item.caution:
                lines.append(f"    caution: {item.caution}")
        lines.append("Decide each: .mark_applied(result=...), .mark_not_applied(), .give_up()")
        return "\n".join(lines)

    @shows
    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        renderer = runtime().settings.reconcile_renderer
        if renderer is None:
            return {"text/plain": self.text()}
        return renderer(self)


@validated("kx.reconcile", run_id=RUN_ID, store=STORE)
def reconcile(run_id: str, *, store: Store | None = None) -> Reconciliation:
    """The open unknown effects of ``run_id``, each with its three ways out."""
    store = get_store(store)
    store.get_run(run_id)
    items = [UnknownEffect(store, row) for row in store.open_unknowns(run_id)]
    live = store.live_item_keys(run_id)
    for item in items:
        item.worker_running = item.step_key in live
    return Reconciliation(run_id, store, items)
