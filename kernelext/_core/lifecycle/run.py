"""``kx.Run``: the ``run`` object an agent receives, and only what an agent calls on it.

The engine behind it (the store, the ledger, the stop flag, the open step) is a
``RunEngine`` (``run_engine``); ``engine_of(run)`` is kernelext's one way from the one to
the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ..._shown import shows
from ..._validate import (
    FUNCTION,
    NOTE,
    check_amount,
    check_deadline,
    check_iterable,
    check_name,
    optional,
    validated,
)
from ...errors import StopRequested
from ...status import Reason
from ..batch.core import ItemState, refused_state_write
from ..batch.tasks import run_amap
from ..batch.threads import run_map
from ..encoding.names import step_key_of
from ..engine.step_info import current_item
from ..engine.step_skip import StepContext

if TYPE_CHECKING:
    from ..._store.claims import ClaimRow
    from ..engine.run_engine import RunEngine

__all__ = ["AGENT_API", "Run", "engine_of"]

T = TypeVar("T")
R = TypeVar("R")

# What an agent may use on ``run``: the whole public face of ``Run`` (tests pin it).
AGENT_API = (
    "amap",
    "ask",
    "checkpoint",
    "claim",
    "credential",
    "fact",
    "id",
    "map",
    "state",
    "step",
    "steps",
    "stop_requested",
    "suspend",
)


class Run:
    """The ``run`` an agent function receives (``def agent(run, ...)``); kernelext makes it.

    Everything here is safe to call from the agent's code::

        @kx.agent
        def enrich(run, rows):
            for row in run.steps(rows, key=lambda r: r["id"]):
                run.state[row["id"]] = lookup(row)
            return run.state
    """

    __slots__ = ("__weakref__", "_engine")

    def __init__(self, engine: RunEngine) -> None:
        self._engine = engine
        engine.facade = self  # the façade attaches itself: the engine never imports it

    @shows
    def __repr__(self) -> str:
        return f"<kernelext run {self._engine.id!r}>"

    def __reduce__(self) -> Any:  # pickle, copy: a run is this process's, never a copy
        raise TypeError(
            f"a kx.Run (run {self._engine.id!r}) does not travel to other processes: it is "
            "the owner's view of the run. Give run.map(executor=...) items that carry what "
            "fn needs (values read from run.state included) instead of a fn that holds the "
            "run."
        )

    @property
    def id(self) -> str:
        """The run's id (``h.run_id``, the ``runs.id`` column).

        Example::

            log.info("run %s: step %s", run.id, item)
        """
        return self._engine.id

    @property
    def state(self) -> dict[str, Any]:
        """The run's state: a dict, snapshotted at the end of every step and restored on
        resume, so what a completed step put here is here again after a resume. Inside a
        ``run.map`` item it is read-only (return the value from the item instead)::

            run.state.setdefault("done", []).append(item)
        """
        engine = self._engine
        item = current_item(engine)
        if item is not None:
            return ItemState(engine.state, item.key)  # type: ignore[return-value]
        return engine.state

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        item = current_item(self._engine)
        if item is not None:
            raise refused_state_write(item.key)
        self._engine.state = value

    def map(
        self,
        fn: Callable[[T], R],
        items: Iterable[T],
        *,
        key: Callable[[T], Any] | None = None,
        concurrency: int = 8,
        return_exceptions: bool = False,
        name: str | None = None,
        executor: Any = None,
    ) -> list[R]:
        """``fn(item)`` for every item, up to ``concurrency`` at once, in input order.

        Each item is one step of the run, keyed by ``key(item)`` (default: its position;
        a ``str`` or an ``int``, unique). Effects called inside an item are keyed under
        its step, so no key depends on which item finished first. An item's return value
        is stored when it completes; a resume returns stored values and runs only the
        items not completed. A stop starts no new item and lets those in flight finish;
        an item that raises stops new items and ``run.map`` raises ``kx.ItemFailed``
        naming its key (``return_exceptions=True``: the exception takes its place). An
        item waiting for a person (an approval) does not hold up the others: the run
        suspends once nothing else can run. Items read ``run.state`` but never write it.
        ``fn`` is a plain function (in an ``async def`` agent, ``await run.amap`` takes an
        ``async def fn``)::

            ids = run.map(post_row, rows, key=lambda r: r["id"], concurrency=16)
            run.state["ids"] = ids

        ``executor=``: a ``concurrent.futures.Executor`` or a Dask ``distributed.Client``
        (``kernelext[dask]``). A ``ThreadPoolExecutor`` runs the items in its threads here;
        any other runs them in other processes, which record their effects in the run's
        store themselves under the same keys: that needs a PostgreSQL store (a DuckDB one
        is refused before anything is dispatched), and workers connect with their own
        credentials (``PGPASSWORD``, ``PGPASSFILE`` or ``KERNELEXT_STORE``; the task never
        carries a password). ``fn`` and the items are pickled (cloudpickle) before the
        first item is dispatched. This run stays the owner: a stop dispatches nothing
        more and each item ends at its next effect call; a worker that died and whose item
        the executor runs again replays the applied calls and leaves a call in flight
        ``unknown`` for ``kx.reconcile``::

            client = distributed.Client(LocalCluster(n_workers=2))
            vectors = run.map(embed, rows, key=lambda r: r["id"], executor=client)
        """
        if name is not None:
            check_name("run.map(name=...)", name)
        return run_map(
            self._engine,
            fn,
            items,
            key=key,
            concurrency=concurrency,
            return_exceptions=return_exceptions,
            name=name,
            executor=executor,
        )

    def amap(
        self,
        fn: Callable[[T], Awaitable[R]],
        items: Iterable[T],
        *,
        key: Callable[[T], Any] | None = None,
        concurrency: int = 8,
        return_exceptions: bool = False,
        name: str | None = None,
    ) -> Coroutine[Any, Any, list[R]]:
        """``await run.amap(fn, items)`` in an ``async def`` agent: ``run.map`` with an
        ``async def fn``, each item a task on the agent's event loop, up to
        ``concurrency`` at once, the results in input order.

        Everything ``run.map`` promises holds: each item is one step keyed by
        ``key(item)``, its value stored and returned on resume; a stop starts no new item
        and lets those in flight finish; the first item that raises stops new items and
        raises ``kx.ItemFailed`` naming its key; items waiting for a person suspend the
        run once. A forced stop cancels the items in flight (their in-flight effects
        become ``unknown``). The arguments are checked when it is called, before any item
        runs. In a plain ``def`` agent, use ``run.map``::

            @kx.agent
            async def fetch_all(run, urls):
                return await run.amap(fetch_one, urls, key=str, concurrency=32)
        """
        if name is not None:
            check_name("run.amap(name=...)", name)
        return run_amap(
            self._engine,
            fn,
            items,
            key=key,
            concurrency=concurrency,
            return_exceptions=return_exceptions,
            name=name,
        )

    @property
    def stop_requested(self) -> bool:
        """True once a stop was asked for; the next safe point raises ``StopRequested``.
        For a long step that wants to end early on its own::

            while not run.stop_requested and more:
                more = work_a_little()
        """
        return self._engine.stop_event.is_set()

    @validated("run.steps", items=check_iterable, key=optional(FUNCTION), name=optional(check_name))
    def steps(
        self, items: Iterable[T], key: Callable[[T], Any] | None = None, name: str | None = None
    ) -> Iterator[T]:
        """Yield each item as one step. Completed items are skipped on resume.

        ``key`` gives each item a stable identity (default: its position); it returns a
        ``str`` or an ``int``. Between items is a safe point: a pending stop takes effect
        there. ``name`` labels the steps in the panel and the timeline::

            for order in run.steps(orders, key=lambda o: o["id"], name="ship"):
                ship(order)
        """
        engine = self._engine
        engine.count_steps(items)
        for index, item in enumerate(items):
            step_key = step_key_of(key(item)) if key is not None else str(index)
            if engine.begin_step(step_key, name):
                yield item
        engine.finish_open_step()
        engine.safe_point()

    def step(self, name: str, key: str | None = None) -> StepContext:
        """One step as a ``with`` block; its body is skipped on resume once completed.
        ``key`` (default: ``name``) is the step's identity, unique within the run::

            with run.step("fetch"):
                run.state["rows"] = fetch()
        """
        if type(name) is not str or (key is not None and type(key) is not str):  # cheap
            check_name("run.step(name=...)", name)
            if key is not None:
                check_name("run.step(key=...)", key)
        return StepContext(self._engine, key or name, name)

    def checkpoint(self) -> None:
        """An explicit safe point: a pending stop takes effect here, inside a long step.

        Example::

            for page in pages:
                run.checkpoint()
                handle(page)
        """
        self._engine.safe_point()

    @validated("run.suspend", reason=check_name, deadline=check_deadline, note=NOTE)
    def suspend(
        self, reason: str = Reason.OTHER, *, deadline: Any = None, note: str | None = None
    ) -> None:
        """Suspend the run at this point (a safe point); resume with ``kx.resume``.

        ``deadline``: when the suspended run expires; ``None`` takes the reason's expiry
        policy. A ``datetime`` (naive is read as UTC, like every timestamp in the store;
        aware is converted to UTC), or a duration from now (seconds or a ``timedelta``, at
        most 1000 years). A deadline in the past is accepted: the run expires at the next
        sweep::

            if quota_left() == 0:
                run.suspend("rate_limit", deadline=3600, note="quota resets hourly")
        """
        engine = self._engine
        engine.finish_open_step()
        engine.suspend_request = (reason, deadline, note)
        raise StopRequested(reason)

    def claim(self, resource: str, amount: float | None = None) -> ClaimRow:
        """Hold ``resource`` until the run ends (completed, cancelled, expired).

        Exclusive per resource name; a second claim by this run is a no-op. Another
        live or suspended run holding it makes this raise ``ClaimConflict``.
        ``amount`` is recorded with the claim (a budget, a number of slots)::

            run.claim("customer:42")
            run.claim("mail-budget", amount=3.0)
        """
        from ..engine.claims import claim

        return claim(self._engine, resource, amount)

    def ask(self, prompt: str, *, schema: Any = None, default: Any = None) -> Any:
        """Ask a person and return the answer: the run suspends here (reason ``input``)
        until ``kx.answer(run_id, value)``; every later resume returns the stored answer
        without asking. ``schema``: ``str``, ``int``, ``float``, ``bool``, a list of
        choices, or a JSON-schema dict for a small form; ``default`` pre-fills the input.
        The step around the question runs again on resume (its effects are replayed)::

            size = run.ask("Which size?", schema=["S", "M", "L"], default="M")
        """
        from ..people.asking import ask

        return ask(self._engine, prompt, schema=schema, default=default)

    @validated(
        "run.fact",
        name=check_name,
        check=optional(FUNCTION),
        tolerance=optional(check_amount),
        kind=check_name,
        compare=optional(FUNCTION),
    )
    def fact(
        self,
        name: str,
        value: Any,
        check: Callable[..., Any] | None = None,
        args: Iterable[Any] = (),
        *,
        tolerance: float | None = None,
        kind: str = "value",
        compare: Callable[[Any, Any], Any] | None = None,
    ) -> Any:
        """Record a premise the rest of the run depends on; returns ``value``.

        ``check(*args)`` must give the current value again on resume: a named
        (module- or notebook-level) function, found by name in a fresh kernel, with
        JSON ``args``. On resume every fact of the completed steps is re-checked
        before anything runs; equality by default, ``tolerance`` for numbers, or
        ``compare(recorded, current) -> bool``. A contradiction stops the resume in
        ``needs_decision`` (see ``kx.revalidation``). ``kind="credential"``: the
        value is never stored (only a fingerprint); on resume it is refreshed by
        ``kx.credentials.register(name, refresh=fn)``; read it with
        ``run.credential(name)``::

            price = run.fact("price", get_price(sku), check=get_price, args=(sku,))
        """
        from ..facts.facts import record_fact

        return record_fact(
            self._engine, name, value, check, args, tolerance=tolerance, kind=kind, compare=compare
        )

    @validated("run.credential", name=check_name)
    def credential(self, name: str) -> Any:
        """The current value of a credential fact (the refreshed one after a resume).

        Example::

            run.fact("token", login(), kind="credential")
            ...
            api.get(url, token=run.credential("token"))
        """
        from ..facts.credentials import current

        return current(self._engine, name)


def engine_of(run: Run) -> RunEngine:
    """The engine behind the ``run`` an agent received."""
    if not isinstance(run, Run):
        raise TypeError(f"Expected the run an agent receives (kx.Run), not {type(run).__name__}.")
    return run._engine
