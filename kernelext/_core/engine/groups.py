"""kernelext's own exception out of an exception group (``asyncio.TaskGroup``, anyio's).

An agent's code often awaits inside a task group: ``async with stdio_client(...)`` (MCP),
``asyncio.TaskGroup``, anyio's ``create_task_group``. A stop, a forced stop or an error
kernelext raises inside it (``StopRequested`` at a safe point, ``kx.ItemFailed`` from
``run.amap``) comes out wrapped in a ``BaseExceptionGroup``, and a run that ended with the
group would fail instead of suspending. ``unwrap_group`` gives the exception the run (or
the item) ends with: the one kernelext raised, or the group itself when it holds errors of
the agent's own.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Iterator

from ...errors import ForcedStop, KernelextError, NeedsDecision, OwnershipLost, StopRequested

__all__ = ["unwrap_group"]

# Most decisive first: taken over elsewhere, forced, stopped, waiting for a decision.
_CONTROL: tuple[type[BaseException], ...] = (
    OwnershipLost,
    ForcedStop,
    StopRequested,
    NeedsDecision,
)


def _group_type() -> type[BaseException] | None:
    """``BaseExceptionGroup``: built in from Python 3.11; on 3.10, the backport's, once
    something that raises such groups (anyio) has imported it."""
    found = getattr(builtins, "BaseExceptionGroup", None)
    if found is None:
        found = getattr(sys.modules.get("exceptiongroup"), "BaseExceptionGroup", None)
    return found if isinstance(found, type) else None


def _leaves(exc: BaseException, group: type[BaseException]) -> Iterator[BaseException]:
    if isinstance(exc, group):
        for inner in getattr(exc, "exceptions", ()):
            yield from _leaves(inner, group)
    else:
        yield exc


def unwrap_group(exc: BaseException) -> BaseException:
    """``exc``, or for an exception group the kernelext exception it carries (see the
    module's text): a stop or a decision wherever it is in the group; a kernelext error
    when it is the group's only exception."""
    group = _group_type()
    if group is None or not isinstance(exc, group):
        return exc
    leaves = list(_leaves(exc, group))
    for kind in _CONTROL:
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    if len(leaves) == 1 and isinstance(leaves[0], KernelextError):
        return leaves[0]
    return exc
