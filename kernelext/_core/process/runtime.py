"""The runtime: everything kernelext keeps in a process, held by one object.

A :class:`Runtime` holds the settings (options, renderers, the expiry policy, the open
store), the definitions code registers (``@kx.agent`` agents, ``kx.checks``,
``kx.credentials``, effect probes) and the state of the runs of this process (live runs
and their handles, resume guards, arguments, open ``%%agent`` runs, credential values,
end hooks, ``kx.on_expire`` callbacks). Core code reads it through :func:`runtime` when
it acts, never at import time, so a new runtime starts empty.

One runtime is current **per process**, not per thread or context: worker threads,
monitors and sweepers read the same one as the code that started them, which is what a
kernel needs. Switch runtimes only while no run of the current one is live (tests end
their live runs first). ``kx.secrets`` stays process-wide on purpose: a value registered
once is scrubbed from everything the process writes or logs, whatever runtime wrote it.

Embedding kernelext (an application, a test) in a runtime of its own::

    import kernelext as kx
    from kernelext._core.process.runtime import Runtime, use_runtime

    with use_runtime(Runtime()) as rt:
        kx.configure(store="/srv/app/kernelext.duckdb", check_timeout=5)

        @kx.agent(name="triage")
        def triage(run: kx.Run, ticket: str) -> None: ...

        triage.start("T-1").wait()
    # the previous runtime is current again, and the store ``rt`` opened is closed

``Runtime(definitions_from=runtime())`` starts with the agents, checks, credential
refreshers and probes of the current runtime (code its modules registered at import)
but none of its state. ``use_runtime(rt)`` without ``with`` just makes ``rt`` current,
for an application that runs in one runtime from start to end.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Protocol, TypeVar, cast

from ..._expiry_policy import ExpiryPolicy
from ..._shown import shows
from ..._store import Store, default_store_path, open_store
from ...errors import RunStateError
from ...status import FINAL
from .options import OptionValues
from .registries import CheckRegistry, CredentialRegistry

__all__ = [
    "AgentDef",
    "ExpireCallback",
    "LimitDef",
    "LiveHandle",
    "OpenCellRun",
    "Runtime",
    "RuntimeSwitch",
    "Settings",
    "get_store",
    "runtime",
    "use_runtime",
]

T = TypeVar("T")


# What the runtime's tables hold, as the runtime and their readers see it. The runtime
# imports none of the modules that fill them (it is below them all); each table's owner
# puts its own kind in and narrows with isinstance where it needs more.
class AgentDef(Protocol):
    """An agent registered by name (``agent.Agent``)."""

    @property
    def name(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...  # of its code, compared with a run's on resume

    @property
    def fn(self) -> Callable[..., Any]: ...


class LimitDef(Protocol):
    """A ``kx.limit`` declared by name (``limits.Limit``); its slots are the process's."""

    @property
    def name(self) -> str: ...


class LiveHandle(Protocol):
    """A run this runtime executes (``handle.Handle``), as the tables' readers use it."""

    @property
    def run_id(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def run(self) -> Any: ...  # the façade its agent receives (``kx.Run``)

    @property
    def alive(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> str: ...

    def force_stop(self, source: str = "api", *, cut_calls: bool = False) -> None: ...


class OpenCellRun(Protocol):
    """An open ``%%agent`` run (``cell_runs.CellRun``), cached by (store location, run id)."""

    @property
    def store(self) -> Store: ...


ExpireCallback = Callable[[Any], Any]  # kx.on_expire's: called with an ``expiry.ExpiredRun``


class Settings(OptionValues):
    """Options (``kx.configure``, ``%config Kernelext``), renderers, and the open store.

    The options are declared in ``options.py``: the plain ones are attributes inherited
    from :class:`OptionValues` (each starts at its default), ``store`` is kept as
    ``store_location`` (and the open store), ``expiry`` as the policy ``expiry``.

    Each runtime has its own, so its expiry policy too: a store it opens or is given
    (``use_store``) sets waiting runs' deadlines from that policy.
    """

    def __init__(self) -> None:
        self.store_location: str | None = None
        self.expiry: ExpiryPolicy = ExpiryPolicy()  # the stores this runtime uses read it too
        self.handle_renderer: Callable[[Any], Any] | None = None
        self.reconcile_renderer: Callable[[Any], Any] | None = None
        self.approvals_renderer: Callable[[Any], Any] | None = None
        self.revalidation_renderer: Callable[[Any], Any] | None = None
        self.runs_renderer: Callable[[Any], Any] | None = None  # kx.runs() shown live
        self._store: Store | None = None
        self._lock = threading.Lock()

    @property
    def store_open(self) -> bool:
        """Whether a default store is open now (``store()`` would not open one)."""
        store = self._store
        return store is not None and not store.closed

    def store(self) -> Store:
        """The default store, opened on first use (``store_location``, else
        ``KERNELEXT_STORE``, else ``.kernelext/store.duckdb`` in the project)."""
        with self._lock:
            if self._store is None or self._store.closed:
                self._store = open_store(self.store_location or default_store_path())
                self._store.expiry = self.expiry
            return self._store

    def use_store(self, location: str | Store | None) -> Store | None:
        """Switch the default store (closing the previous one if this process opened it)."""
        with self._lock:
            old = self._store
            if isinstance(location, Store):
                self._store = location
                self.store_location = location.location
                location.expiry = self.expiry
            else:
                self._store = None
                self.store_location = location
        if old is not None and old is not location and not isinstance(location, Store):
            old.close()
        return self._store

    def close(self) -> None:
        """Close the default store; the next use opens it again."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()


class Runtime:
    """Settings, registries and the open store of kernelext, in one object.

    Attributes (read them through ``runtime()`` at the moment of use):

    - ``settings``: options, renderers, expiry policy and the default store.
    - Definitions: ``agents`` (name -> ``Agent``), ``checks`` (``kx.checks``),
      ``credentials`` (``kx.credentials``), ``probes`` (effect tool -> probe),
      ``limits`` (``kx.limit``, name -> ``Limit``),
      ``agent_sources`` (fingerprint -> source, for plan diffs).
    - Runs here: ``live_runs`` (run id -> handle of a run executing in a worker thread),
      ``handles`` (run id -> newest handle, weakly) and ``tracks`` ((store location, run
      id) -> the run's latest start or resume here, which all its handles follow, weakly:
      ``handle.RunTrack``), all under ``live_lock``;
      ``args_cache`` (arguments that are not JSON, for a resume in this runtime);
      ``cell_runs`` (open ``%%agent`` runs by (store location, run id), under
      ``cell_runs_lock``); ``credential_values`` and ``local_checks`` (lambdas and
      closures of facts); ``cell_sources`` and ``cell_sources_by_hash`` (for plans).
    - Listeners: ``end_hooks`` (called with (run id, status) when a run of this runtime
      ends or suspends, see :meth:`run_ended`) and ``expire_callbacks`` (``kx.on_expire``).

    ``lock`` guards the small tables (probes, sources, limits, credential values, local
    checks, expire callbacks); no store call is made while it is held.
    """

    def __init__(self, *, definitions_from: Runtime | None = None) -> None:
        self.settings = Settings()
        self.lock = threading.Lock()
        # definitions: what code registers when it is imported or run
        self.agents: dict[str, AgentDef] = {}
        self.checks = CheckRegistry()
        self.credentials = CredentialRegistry()
        self.probes: dict[str, Callable[[str, Any], Any]] = {}
        self.agent_sources: dict[str, str] = {}
        self.limits: dict[str, LimitDef] = {}  # kx.limit, by name (under ``lock``)
        # the runs of this runtime
        self.live_lock = threading.Lock()
        self.live_runs: dict[str, LiveHandle] = {}
        self.handles: weakref.WeakValueDictionary[str, LiveHandle] = weakref.WeakValueDictionary()
        self.tracks: weakref.WeakValueDictionary[tuple[str, str], Any] = (
            weakref.WeakValueDictionary()
        )
        self.args_cache: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self.cell_runs_lock = threading.Lock()
        self.cell_runs: dict[tuple[str, str], OpenCellRun] = {}
        self.credential_values: dict[str, dict[str, Any]] = {}
        self.local_checks: dict[tuple[str, str, str], Callable[..., Any]] = {}
        self.cell_sources: dict[tuple[str, str], str] = {}
        self.cell_sources_by_hash: dict[str, str] = {}
        self.end_hooks: list[Callable[[str, str], None]] = []
        self.expire_callbacks: list[ExpireCallback] = []
        # run id -> (thread, depth) of the one resume of that run under way here
        self._resuming: dict[str, tuple[int, int]] = {}
        self._resuming_lock = threading.Lock()
        self._extensions: dict[str, Any] = {}
        if definitions_from is not None:
            self.copy_definitions(definitions_from)

    def copy_definitions(self, other: Runtime) -> None:
        """Take over ``other``'s agents, checks, credential refreshers and probes."""
        self.agents.update(other.agents)
        self.checks.copy_from(other.checks)
        self.credentials.copy_from(other.credentials)
        with other.lock:
            probes, sources = dict(other.probes), dict(other.agent_sources)
            limits = dict(other.limits)
        with self.lock:
            self.probes.update(probes)
            self.agent_sources.update(sources)
            self.limits.update(limits)  # the same limits: their slots are the process's

    # -- runs of this runtime -------------------------------------------------------------
    def live_handle(self, run_id: str, store: Store | None = None) -> LiveHandle | None:
        """The handle of run ``run_id`` if it executes in a worker thread of this runtime
        (with ``store``: in that store; a run of the same id in another store is not it)."""
        with self.live_lock:
            handle = self.live_runs.get(run_id)
        if handle is None or not handle.alive:
            return None
        if store is not None and handle.store.location != store.location:
            return None
        return handle

    def live_handles(self) -> list[LiveHandle]:
        """Handles of the runs executing in a worker thread of this runtime now."""
        with self.live_lock:
            handles = list(self.live_runs.values())
        return [h for h in handles if h.alive]

    @contextlib.contextmanager
    def resuming(self, run_id: str) -> Iterator[None]:
        """Hold ``run_id`` for one resume in this runtime: check, take over, launch.

        A second thread that tries to resume the same run meanwhile gets ``RunStateError``
        at once (it does not wait: one resume wins, the other is told so). The thread that
        holds it may enter again (a resume that hands over to the ``%%agent`` path).
        Across processes the run's lease decides (see ``lease.check_takeover``).
        """
        me = threading.get_ident()
        with self._resuming_lock:
            holder, depth = self._resuming.get(run_id, (me, 0))
            if holder != me:
                raise RunStateError(
                    f"Run {run_id!r} is already being resumed in this process (by another "
                    "thread). Use the handle that call returns; wait for the run with its "
                    ".wait()."
                )
            self._resuming[run_id] = (me, depth + 1)
        try:
            yield
        finally:
            with self._resuming_lock:
                holder, depth = self._resuming[run_id]
                if depth > 1:
                    self._resuming[run_id] = (holder, depth - 1)
                else:
                    del self._resuming[run_id]

    def run_ended(self, run_id: str, status: str) -> None:
        """Run ``run_id`` of this runtime reached ``status`` (it ended, suspended or expired):
        its credential values are dropped once it is final, then every end hook is called
        (a hook that raises is skipped)."""
        if status in FINAL:
            with self.lock:
                self.credential_values.pop(run_id, None)
        for hook in list(self.end_hooks):
            try:
                hook(run_id, status)
            except Exception:
                continue

    def extension(self, name: str, make: Callable[[], T]) -> T:
        """The state extension ``name`` (an adapter) keeps in this runtime, made by
        ``make()`` on first use."""
        with self.lock:
            if name not in self._extensions:
                self._extensions[name] = make()
            return cast(T, self._extensions[name])

    def close(self) -> None:
        """Close the default store this runtime opened (or was given); the next use
        opens it again."""
        self.settings.close()

    @shows
    def __repr__(self) -> str:
        where = self.settings.store_location or "default location"
        state = "open" if self.settings.store_open else "closed"
        return (
            f"<kernelext Runtime: store {where} ({state}), {len(self.agents)} agent(s), "
            f"{len(self.live_handles())} live run(s)>"
        )


_current = Runtime()
_switch_lock = threading.Lock()


def runtime() -> Runtime:
    """The current runtime of this process (see the module docstring)."""
    return _current


class RuntimeSwitch:
    """What :func:`use_runtime` returns: leaving its ``with`` block (or calling
    :meth:`restore`) makes the previous runtime current again."""

    def __init__(self, new: Runtime, previous: Runtime) -> None:
        self.runtime = new
        self.previous = previous
        self._restored = False

    def restore(self) -> None:
        """Make the previous runtime current again and close the store this one opened."""
        global _current
        with _switch_lock:
            if self._restored:
                return
            self._restored = True
            _current = self.previous
        if self.runtime is not self.previous:
            self.runtime.close()

    def __enter__(self) -> Runtime:
        return self.runtime

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def use_runtime(rt: Runtime) -> RuntimeSwitch:
    """Make ``rt`` the current runtime now; as a context manager, put the previous one back
    on exit (and close the store ``rt`` opened). End ``rt``'s live runs before leaving:
    its worker threads read the current runtime too."""
    global _current
    if not isinstance(rt, Runtime):
        raise TypeError(f"use_runtime() takes a Runtime, not {type(rt).__name__}.")
    with _switch_lock:
        previous, _current = _current, rt
    return RuntimeSwitch(rt, previous)


def get_store(store: Store | None = None) -> Store:
    """``store`` if given, else the current runtime's default store (opened if needed)."""
    return store if store is not None else _current.settings.store()


def _close_at_exit() -> None:
    runtime().close()


atexit.register(_close_at_exit)
