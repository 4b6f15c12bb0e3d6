"""MCP tools as recorded effects: ``session = kx.mcp(ClientSession(...))``.

Inside a run, ``await session.call_tool(name, arguments)`` is an effect named
``mcp:<server>/<tool>``, with the ledger's rules: the intent is durable before the
request leaves, the ``CallToolResult`` is recorded as JSON, and a resumed run gets the
recorded result back (rebuilt as a ``CallToolResult``) instead of calling the tool
again. A call whose outcome nobody knows (the process died or the call was cancelled
mid-way) goes to ``kx.reconcile`` like any other effect. Outside a run, and for every
other method, the wrapper is the plain session.

How an async call is recorded: ``call_tool`` is a plain method that returns an
awaitable. The synchronous half of ``Effect`` (stop check, key, replay, durable intent)
runs when ``call_tool`` is *called*, in the caller's thread, where the run is known and
where a stop must be raised; the call ordinal follows the order of the calls in the
agent's code, not the order in which the event loop finishes them. The network call is
the awaitable; once it settled, ``Effect``'s own outcome code records ``applied``,
``failed`` or ``unknown`` (cancelled) exactly as for a synchronous effect. So it works
whether the agent awaits on its own loop (``asyncio.run`` in a step) or hands the
awaitable to a loop in another thread (``asyncio.run_coroutine_threadsafe``). Await
every call: one never awaited stays ``pending`` and the run's resume asks for a decision.

The ``mcp`` package is imported only when a session is wrapped (``kernelext[mcp]``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine
from typing import Any, TypeVar

from .._core.engine.context import current_run
from .._core.engine.run_engine import RunEngine
from .._core.ledger.effect import Effect
from .._shown import shows
from ..errors import KernelextError

__all__ = [
    "ApprovalRule",
    "McpSession",
    "ToolCall",
    "rebuild_result",
    "result_json",
    "wrap_mcp",
]

T = TypeVar("T")
INSTALL_HINT = "pip install 'kernelext[mcp]'"

# Which calls need a person's approval: all (True), none (False), these tool names (bare
# ``send`` or full ``mcp:server/send``), or ``rule(tool, arguments) -> bool``.
ApprovalRule = bool | Collection[str] | Callable[[str, dict[str, Any]], bool]


def _require_mcp() -> Any:
    """The ``mcp.types`` module, or an ImportError that names the extra."""
    try:
        import mcp.types
    except ImportError as exc:
        raise ImportError(
            "kx.mcp needs the MCP Python SDK, which is not installed. Install it with "
            f"{INSTALL_HINT}"
        ) from exc
    return mcp.types


def wrap_mcp(
    session: Any,
    server: str | None = None,
    *,
    needs_approval: ApprovalRule = False,
    resumable: bool = True,
    retry: bool = False,
) -> McpSession:
    """Wrap an MCP ``ClientSession`` so that its tool calls inside a run are effects.

    ``server`` names the server in the ledger (``mcp:<server>/<tool>``); without it the
    name the server gave at ``initialize()`` is used. Give it when the session may be
    initialized elsewhere: the name is part of each call's key, so it must be the same on
    every resume. ``needs_approval`` says which tool calls wait for a person's approval
    (True, a set of tool names, or ``rule(tool, arguments) -> bool``). ``resumable`` and
    ``retry`` mean what they mean for ``@kx.effect``.
    """
    _require_mcp()
    if isinstance(session, McpSession):
        session = session.session
    return McpSession(
        session, server, needs_approval=needs_approval, resumable=resumable, retry=retry
    )


class McpSession:
    """What ``kx.mcp`` returns: the session, with ``call_tool`` recorded inside a run."""

    def __init__(
        self,
        session: Any,
        server: str | None,
        *,
        needs_approval: ApprovalRule,
        resumable: bool,
        retry: bool,
    ) -> None:
        self.session = session
        self.server = server
        self.needs_approval = needs_approval
        self.resumable = resumable
        self.retry = retry
        self._initialize_result: Any = None

    # -- the recorded call ---------------------------------------------------------------
    def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any
    ) -> Awaitable[Any]:
        """``await session.call_tool(name, arguments, ...)``: recorded inside a run.

        The arguments are the key's fingerprint (a resume must make the same call); the
        other options (timeouts, progress callbacks, ``meta``) are passed on unrecorded.
        """
        run = current_run()
        if run is None:
            plain: Awaitable[Any] = self.session.call_tool(name, arguments, *args, **kwargs)
            return plain
        tool = self.tool_name(name)

        def send() -> Awaitable[Any]:
            sent: Awaitable[Any] = self.session.call_tool(name, arguments, *args, **kwargs)
            return sent

        call = ToolCall(
            tool,
            send,
            resumable=self.resumable,
            retry=self.retry,
            needs_approval=self.approval_required(name, dict(arguments or {})),
        )
        outcome = call(dict(arguments or {}))
        if isinstance(outcome, _InFlight):
            return outcome.coroutine
        return _ready(rebuild_result(outcome))

    def tool_name(self, tool: str) -> str:
        """The effect's name in the ledger: ``mcp:<server>/<tool>``."""
        server = self.server or self._server_info_name()
        if not server:
            raise KernelextError(
                f"kx.mcp cannot name the server of tool {tool!r}: the session has not been "
                "initialized through the wrapper and no server name was given. Call "
                "`await session.initialize()` first, or wrap it as kx.mcp(session, "
                "server='name'). The name is part of each call's ledger key."
            )
        return f"mcp:{server}/{tool}"

    def approval_required(self, tool: str, arguments: dict[str, Any]) -> bool:
        """Whether a call of ``tool`` with ``arguments`` waits for approval (see
        ``needs_approval``); ``tool`` is the bare MCP tool name."""
        rule = self.needs_approval
        if isinstance(rule, bool):
            return rule
        if isinstance(rule, str):
            rule = (rule,)
        if callable(rule):
            return bool(rule(tool, arguments))
        server = self.server or self._server_info_name()
        return tool in rule or (server is not None and f"mcp:{server}/{tool}" in rule)

    # -- everything else passes through --------------------------------------------------
    async def initialize(self, *args: Any, **kwargs: Any) -> Any:
        """The session's ``initialize()``; the server's name is kept for the ledger."""
        result = await self.session.initialize(*args, **kwargs)
        self._initialize_result = result
        return result

    async def __aenter__(self) -> McpSession:
        await self.session.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self.session.__aexit__(*exc_info)

    def __getattr__(self, name: str) -> Any:
        if name == "session":  # not set yet (a copy being made): do not recurse
            raise AttributeError(name)
        return getattr(self.session, name)

    @shows
    def __repr__(self) -> str:
        return f"<kernelext mcp session {self.server or self._server_info_name()!r}>"

    def _server_info_name(self) -> str | None:
        info = getattr(self.session, "server_info", None)  # a property in mcp 2
        if info is None and self._initialize_result is not None:
            result = self._initialize_result
            info = getattr(result, "server_info", None) or getattr(result, "serverInfo", None)
        name = getattr(info, "name", None)
        return name if isinstance(name, str) and name else None


# -- one call as an Effect -----------------------------------------------------------------
def _arguments(arguments: dict[str, Any]) -> Any:
    """The signature a tool call is recorded under: its arguments (never called)."""
    raise NotImplementedError  # pragma: no cover


class _InFlight:
    """What ``ToolCall`` gives back when the call must be made: its awaitable."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self.coroutine = coroutine


class ToolCall(Effect):
    """One MCP tool call run through ``Effect``: the intent and the replay as for any
    effect; the call itself is awaited, then its outcome is recorded by ``Effect``'s own
    code (``applied`` with the result as JSON, ``failed``, or ``unknown`` if cancelled)."""

    editable = False  # sent by ``send`` as the agent made it: an edit cannot reach it

    def __init__(
        self,
        tool: str,
        send: Callable[[], Awaitable[Any]],
        *,
        resumable: bool,
        retry: bool,
        needs_approval: bool = False,
    ) -> None:
        super().__init__(
            _arguments, name=tool, resumable=resumable, retry=retry, needs_approval=needs_approval
        )
        self.send = send

    def _perform(
        self, run: RunEngine, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return _InFlight(self._settle(run, key, args, kwargs))

    async def _settle(
        self, run: RunEngine, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            live = await self.send()
        except BaseException as exc:  # recorded by Effect: failed, or unknown if cancelled
            error = exc

            def fail(*_: Any) -> Any:
                raise error

            self.fn = fail
        else:
            self.fn = lambda *_: result_json(live)
        super()._perform(run, key, args, kwargs)
        return live  # the caller gets the live result; a resume gets the recorded JSON


def result_json(result: Any) -> Any:
    """A tool call's result as the JSON it is recorded as (the MCP wire form)."""
    dump = getattr(result, "model_dump", None)
    if dump is None:
        return result
    return dump(mode="json", by_alias=True, exclude_none=True)


def rebuild_result(value: Any) -> Any:
    """A recorded result as the SDK's model: a ``CallToolResult`` (or the
    ``InputRequiredResult`` it was). A result entered at reconciliation that is not one
    becomes a ``CallToolResult`` with the value as text (and as structured content)."""
    types = _require_mcp()
    if isinstance(value, dict):
        input_required = getattr(types, "InputRequiredResult", None)
        kind = types.CallToolResult
        if value.get("resultType") == "input_required" and input_required is not None:
            kind = input_required
        try:
            return kind.model_validate(value)
        except ValueError:  # pydantic's ValidationError is a ValueError
            pass
    text = value if isinstance(value, str) else json.dumps(value)
    return types.CallToolResult.model_validate(
        {
            "content": [{"type": "text", "text": text}] if value is not None else [],
            "structuredContent": value if isinstance(value, dict) else None,
            "isError": False,
        }
    )


async def _ready(value: T) -> T:
    return value
