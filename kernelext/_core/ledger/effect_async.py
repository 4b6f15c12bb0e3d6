"""``@kx.effect`` on an ``async def``: the same ledger, the tool awaited.

Calling an async effect inside a run returns a coroutine; awaiting it goes through the
steps of a sync call (``Effect``'s own code, nothing copied):

1. **Before the call** (``Effect._prepare``): the stop check, the key (the call ordinal
   taken on the loop, counted within the step or ``run.amap`` item in the order the calls
   start, so no key depends on a thread), the approval of a gated call, and the intent,
   durable before the tool is called at all. The durable write waits in a thread (the
   batch's, ``Batch.executor``, or the loop's default one), so the intents of items
   running at once share one fsync while the loop goes on. A recorded call is replayed
   here: its stored result is returned and the tool is not called. A cancellation that
   comes while the intent is written waits for it, and a recorded call not made is
   ``unknown`` (as a forced stop landing between a sync intent and its call).
2. **The call**: ``await fn(...)``, with ``idempotency_key`` when the tool takes one.
3. **After the call** (``Effect._applied`` / ``_failed`` / ``_interrupted``): ``applied``
   with the stored result, ``failed`` for an exception, ``unknown`` for a cancellation
   (a forced stop of an async agent or ``run.amap`` item cancels its task: the
   ``CancelledError`` lands in the awaited tool); ``not_applied`` (``_not_reached``) when
   a call made inside it waits for approval or was rejected (``effect_approval``).

kernelext's bookkeeping never awaits the tool's loop, so a cancellation lands in the tool
(or, before it, in the wait for the intent: see 1).
Effects started at once inside one item (``asyncio.gather``) take their call ordinals in
the order they start; give each its own ``run.amap`` item when their order may change.
Outside a run the coroutine is the tool's own, nothing recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from typing import TYPE_CHECKING, Any

from ..._validate_functions import refuse_unrun_result
from .effect_approval import left_inside
from .evidence import Evidence, watching
from .retries import judged_once

if TYPE_CHECKING:
    from ..engine.run_engine import RunEngine
    from .effect import Effect

__all__ = ["call_async"]


async def call_async(
    effect: Effect, run: RunEngine, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """One awaited call of ``effect`` inside ``run`` (see the module's text)."""
    # The key's ordinal is taken here, on the loop, in the order the calls start; the
    # intent's durable write waits in a thread, so that the intents of items running at
    # once share one fsync (group commit) while the loop goes on with the others.
    slot = run.next_call()
    context = contextvars.copy_context()  # the item and the run, as here
    item = run.current
    executor = item.batch.executor if item is not None and item.batch is not None else None
    prepared = asyncio.get_running_loop().run_in_executor(
        executor, context.run, effect._prepare, run, args, kwargs, slot
    )
    try:
        key, call, replayed = await asyncio.shield(prepared)
    except asyncio.CancelledError:  # cancelled (a forced stop) while the intent was written
        with contextlib.suppress(BaseException):
            key, call, _ = await prepared  # (refused, or raised: nothing to make)
            if call:  # recorded, and the call is not made now: nobody can say more
                effect._interrupted(run, key)
        raise
    if not call:
        return replayed
    args, kwargs = effect._made_with(key, args, kwargs)
    call_kwargs = effect._call_kwargs(run, key, kwargs)
    evidence: Evidence | None = None
    try:
        with watching() as evidence:  # what proves a failed call never left
            result = await effect.fn(*args, **call_kwargs)
        refuse_unrun_result(effect.tool, result)
    except BaseException as exc:
        why = left_inside(exc)  # a call made inside waits for approval, or was rejected
        if why is not None:
            effect._not_reached(run, key, why)
            raise
        if not isinstance(exc, Exception):  # cancelled (a forced stop), the process going down
            effect._interrupted(run, key)
            raise
        decided = judged_once(effect, run, key, exc, evidence)  # the retry rule: unknown?
        if decided is not None:
            raise decided from exc
        effect._failed(run, key, exc)
        raise
    return effect._applied(run, key, result)
