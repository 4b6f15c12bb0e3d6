"""``Handle``: a run as this process sees it (its panel), and asking a run to stop."""

from __future__ import annotations

import threading
import traceback
from typing import Any

from ..._formatting import moment_text
from ..._shown import shows
from ..._store import Store
from ..._store.columns import scrubbed_excerpt
from ..._store.records import FORCE_REQUESTED
from ..._validate import FLAG, NOTE, SOURCE, check_wait, optional, validated
from ...errors import StoreWriteError
from ...status import Status
from ..batch.view import batch_counts
from ..engine.run_engine import RunEngine
from ..engine.stop_estimate import estimate_stop
from ..process.runtime import LiveHandle, runtime
from ..views.conversation import conversation_of
from .run import engine_of
from .stop_answer import StopAnswer, busy_answer, nothing_to_stop

__all__ = ["ERROR_SHOWN", "Handle", "RunTrack", "post_stop_if_busy", "request_stop"]

ERROR_SHOWN = 500  # characters of an error a display shows: as many as runs.reason keeps


class RunTrack:
    """The latest attempt (start or resume) of one run in this process, shared by all the
    run's handles here (``runtime().tracks``, by store location and run id)."""

    __slots__ = ("__weakref__", "latest")

    def __init__(self) -> None:
        self.latest: Handle | None = None


class Handle:
    """A run executing (or finished) in this process. Displays as its control panel.

    A handle follows its run: once the run is resumed here (``kx.resume``, an approval or
    an answer given in this process), ``wait()``, ``result``, ``error``, ``status``,
    ``run``, the stops and the panel read the resumed attempt (``newest``), whichever
    handle of the run the user holds."""

    def __init__(self, engine: RunEngine, store: Store, *, attempt: bool = False) -> None:
        self._run = engine.facade  # the run as its agent sees it: h.run.state, h.run.id
        self.store = store
        self.run_id = engine.id
        self._thread: threading.Thread | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._final_status: str | None = None
        self._store_fault: StoreWriteError | None = None  # the store refused the run's end
        rt = runtime()
        with rt.live_lock:
            rt.handles[self.run_id] = self
            track = rt.tracks.get((store.location, self.run_id))
            if track is None:
                track = rt.tracks[(store.location, self.run_id)] = RunTrack()
            if attempt:  # a start or a resume here: every handle of the run follows it
                track.latest = self
        self._track: RunTrack = track

    # -- the run's latest attempt -----------------------------------------------------------
    @property
    def newest(self) -> Handle:
        """The handle of this run's latest start or resume in this process (``self`` for a
        handle on a run that never executed here)."""
        return self._track.latest or self

    @property
    def run(self) -> Any:
        return self.newest._run

    @property
    def thread(self) -> threading.Thread | None:
        return self.newest._thread

    @thread.setter
    def thread(self, value: threading.Thread | None) -> None:
        self._thread = value

    @property
    def result(self) -> Any:
        """What the agent returned, once the run's latest attempt completed."""
        return self.newest._result

    @result.setter
    def result(self, value: Any) -> None:
        self._result = value

    @property
    def error(self) -> BaseException | None:
        """The exception the run's latest attempt raised (``None`` if it raised nothing)."""
        return self.newest._error

    @error.setter
    def error(self, value: BaseException | None) -> None:
        self._error = value

    @property
    def final_status(self) -> str | None:
        return self.newest._final_status

    @final_status.setter
    def final_status(self, value: str | None) -> None:
        self._final_status = value

    @property
    def store_fault(self) -> StoreWriteError | None:
        return self.newest._store_fault

    @store_fault.setter
    def store_fault(self, value: StoreWriteError | None) -> None:
        self._store_fault = value

    # -- status ---------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def status(self) -> str:
        """The run's status in the store; once the run ended here, the status its end
        gives it even while another process holds the store file (the end is durable in
        this process's journal and reaches the tables when the file is free)."""
        store = self.newest.store
        journaled = store.journaled_end(self.run_id)
        if journaled is not None:
            return journaled
        return str(store.get_run(self.run_id)["status"])

    def info(self) -> dict[str, Any]:
        return self.store.get_run(self.run_id)

    @validated("Handle.wait", timeout=optional(check_wait))
    def wait(self, timeout: float | None = None) -> str:
        """Block until the run stops, suspends or finishes; return its status. After a
        resume in this process, it waits for the resumed attempt."""
        current = self.newest
        thread = current._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                return Status.RUNNING
        if current is not self.newest:  # resumed again meanwhile (a person answered at once)
            return self.newest.wait(timeout)
        final = current._final_status
        if final is not None and (current.store.closed or current._store_fault):
            return final
        return current.status

    # -- control --------------------------------------------------------------------
    @validated("Handle.stop", source=SOURCE, who=NOTE)
    def stop(self, source: str = "api", *, who: str | None = None) -> StopAnswer:
        """Ask the run to stop at its next safe point. Returns the status after the request;
        for a run no longer running (completed, failed, waiting) its ``notice`` says there
        was nothing to stop and what to do instead (a notebook shows it).

        A run executing here returns ``"stopping"`` at once: the request never waits for
        the store (see ``request_stop``).
        """
        return request_stop(self.store, self.run_id, source=source, who=who, handle=self)

    @validated("Handle.force_stop", source=SOURCE, cut_calls=FLAG)
    def force_stop(self, source: str = "api", *, cut_calls: bool = False) -> None:
        """Stop now: raise into the step. A recorded call in flight is waited for (up to
        the ``force_call_grace`` option) and keeps its real outcome; a call cut by a second
        Force stop, after the grace, or at once with ``cut_calls=True`` becomes ``unknown``
        (decide it with ``kx.reconcile``)."""
        self.stop(source)
        engine_of(self.run).force.want(runtime().settings.force_call_grace, cut=cut_calls)
        self.store.record_event(self.run_id, FORCE_REQUESTED, source=source, wait=False)

    def steps(self) -> list[dict[str, Any]]:
        return self.store.steps(self.run_id)

    def events(self) -> list[dict[str, Any]]:
        return self.store.events(self.run_id)

    @shows
    def __repr__(self) -> str:
        return f"<kernelext run {self.run_id!r} status={self.status}>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        renderer = runtime().settings.handle_renderer
        if renderer is None:
            # Only IPython asks for this bundle: say how to get the panel there.
            hint = "(for its control panel: %load_ext kernelext, then show the handle again)"
            return {"text/plain": f"{self.text_summary()}\n{hint}"}
        return renderer(self)

    @property
    @shows
    def status_text(self) -> str:
        """``text_summary()``, plus, while a stop is pending, when it should land
        ("stops after step 7, in about 3.0 s"; "overrunning by 12 s"). During a
        ``run.map``: its progress ("batch: 120/400 done, 16 in flight, 35 items/s, about
        8 s left"), and after a stop its drain ("stopping: 12 items in flight, about 3 s")."""
        engine = engine_of(self.run)
        info = self.info()
        line = self.text_summary(info)
        batch = engine.batch if self.alive else None
        if batch is not None:
            stopping = engine.stop_event.is_set() or info["status"] == Status.STOPPING
            return f"{line}; {batch_counts(batch, stopping=stopping).text}"
        current = engine.current if self.alive else None
        estimate = estimate_stop(self.run_id, self.store, run=info, current=current)
        return line if estimate is None else f"{line}; {estimate.text}"

    def error_text(self, info: dict[str, Any] | None = None) -> str | None:
        """The run's error as every display shows it (panel, its saved copy, reprs): the
        text the store holds for a failed run, passed through the store's scrubbing door
        again (a secret registered since is masked too). ``h.error`` keeps the exception
        itself for code; no display reads it raw. ``None`` when the run raised nothing here."""
        if self.error is None:
            return None
        info = info if info is not None else self.info()
        stored = info.get("reason") if info.get("status") == Status.FAILED else None
        text = stored or "".join(traceback.format_exception_only(type(self.error), self.error))
        return scrubbed_excerpt(str(text).strip(), ERROR_SHOWN)  # the store's one door

    @shows
    def text_summary(self, info: dict[str, Any] | None = None) -> str:
        """``run r [agent]: running, 3/5 steps`` (``info``: the run row, if already read)."""
        info = info if info is not None else self.info()
        total = info.get("total_steps")
        done = info.get("completed_steps")
        progress = f"{done}/{total} steps" if total else f"{done} steps"
        if not total:
            talk = conversation_of(self.store.load_effects(self.run_id).values())
            progress = talk.progress(progress, int(done or 0))
        line = f"run {self.run_id} [{info['agent']}]: {info['status']}, {progress}"
        if info.get("reason"):
            line += f" ({info['reason']})"
        if info.get("deadline") and info["status"] == Status.SUSPENDED:
            line += f", expires {moment_text(info['deadline'])}"
        return line


def request_stop(
    store: Store,
    run_id: str,
    *,
    source: str,
    who: str | None = None,
    handle: LiveHandle | None = None,
    epoch: int | None = None,
) -> StopAnswer:
    """Ask run ``run_id`` to stop; return its status after the request.

    A run executing in this process is stopped without waiting for the store (another
    process may hold the DuckDB file for a while): the request is queued (journaled),
    the run's flag is raised, then the request is made durable (``fdatasync``). The
    answer is ``stopping``, known without reading the store. Any other run: the request
    is written to its row, where its owner's monitor sees it.
    """
    handle = handle or runtime().live_handle(run_id, store)
    if handle is None or not handle.alive:
        result = store.request_stop(run_id, source=source, who=who, epoch=epoch)
        if result.ok:
            return StopAnswer(str(result.after))
        return StopAnswer(str(result.before), nothing_to_stop(run_id, str(result.before)))
    try:
        # Queued before the flag goes up, so the request is folded before the suspension
        # the worker writes once it sees the flag (the events keep their order).
        durable = handle.store.queue_stop_request(run_id, source=source, who=who)
    finally:
        _raise_stop_flag(engine_of(handle.run), source)  # even if the request could not be queued
    durable()
    return StopAnswer(Status.STOPPING)


def post_stop_if_busy(
    store: Store,
    run_id: str,
    *,
    source: str,
    who: str | None = None,
    epoch: int | None = None,
    force: bool = False,
) -> StopAnswer | None:
    """Record a stop of a run executing elsewhere without waiting for a busy store file.

    When another process keeps the DuckDB file (a long query) past a second, the request is
    made durable beside it (``Store.post_stop_if_busy``) and the run's process reads it
    from there at once; the answer says so. None: write it in the tables as usual."""
    posted = store.post_stop_if_busy(run_id, source=source, who=who, epoch=epoch, force=force)
    return None if posted is None else busy_answer(run_id, posted, force=force)


def _raise_stop_flag(run: RunEngine, source: str) -> None:
    if run.stop_source is None:
        run.stop_source = source
    run.stop_event.set()
    run.notify("stop", source)
