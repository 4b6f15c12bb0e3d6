"""``@kx.effect`` on an ``async def``: the same ledger, the tool awaited.

Calling an async effect inside a run returns a coroutine; awaiting it goes through the
steps of a sync call (``Effect``'s own code, nothing copied):

1. **Before the call** (``Effect._prepare``, sync, in the loop's thread): the stop check,
   the key (the call ordinal counted within the step or ``run.amap`` item, in the order
   the calls start), the approval of a gated call, and the intent, durable before the
   tool's first ``await``. A recorded call is replayed here: its stored result is
   returned and the tool is not called.
2. **The call**: ``await fn(...)``, with ``idempotency_key`` when the tool takes one.
3. **After the call** (``Effect._applied`` / ``_failed`` / ``_interrupted``): ``applied``
   with the stored result, ``failed`` for an exception, ``unknown`` for a cancellation
   (a forced stop of an async agent or ``run.amap`` item cancels its task: the
   ``CancelledError`` lands in the awaited tool).

kernelext's bookkeeping never awaits, so a cancellation can only land in the tool.
Effects started at once inside one item (``asyncio.gather``) take their call ordinals in
the order they start; give each its own ``run.amap`` item when their order may change.
Outside a run the coroutine is the tool's own, nothing recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._validate import refuse_unrun_result

if TYPE_CHECKING:
    from .ledger import Effect
    from .run_engine import RunEngine

__all__ = ["call_async"]


async def call_async(
    effect: Effect, run: RunEngine, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """One awaited call of ``effect`` inside ``run`` (see the module's text)."""
    key, call, replayed = effect._prepare(run, args, kwargs)
    if not call:
        return replayed
    call_kwargs = effect._call_kwargs(run, key, kwargs)
    try:
        result = await effect.fn(*args, **call_kwargs)
        refuse_unrun_result(effect.tool, result)
    except Exception as exc:
        effect._failed(run, key, exc)
        raise
    except BaseException:  # cancelled (a forced stop), or the process going down
        effect._interrupted(run, key)
        raise
    return effect._applied(run, key, result)
