"""run.map(executor=...) on a real Dask LocalCluster (worker processes) and a real
PostgreSQL: what an item that cannot be rebuilt in a worker does to the cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.postgres,
    # Dask's own sockets and event loops, closed on its schedule, not this test's
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Port .* is already in use:UserWarning"),
]


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
    )
    dask_client = distributed.Client(cluster)
    try:
        yield dask_client
    finally:
        dask_client.close()
        cluster.close()


def _identity(value: Any) -> Any:
    return value


@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt"])
def test_an_item_whose_unpickling_exits_fails_the_item_not_the_workers(
    postgres_url: str, client: Any, raised: str
) -> None:
    import kernelext as kx

    class ExitsOnLoad:  # local: cloudpickle sends the class by value
        def __init__(self, name: str) -> None:
            self.name = name

        def __getstate__(self) -> dict[str, str]:
            return {"name": self.name}

        def __setstate__(self, state: dict[str, str]) -> None:
            import builtins

            raise getattr(builtins, state["name"])("this item cannot be rebuilt here")

    kx.configure(store=postgres_url)
    workers_before = client.run(os.getpid)

    @kx.agent(name=f"exits-on-load-{raised}")
    def agent(run: Any, items: list[Any]) -> Any:
        return run.map(_identity, items, concurrency=2, executor=client)

    handle = agent.start([1, ExitsOnLoad(raised), 3], run_id=f"exits-{raised}")
    assert handle.wait(120) == "failed"
    error = handle.error
    assert isinstance(error, kx.ItemFailed)
    assert error.key == "1"
    assert "could not be rebuilt in the worker process" in str(error)
    assert raised in str(error)
    assert client.run(os.getpid) == workers_before  # no worker process died for it
    steps = kx.sql(f"SELECT key, status FROM steps WHERE run_id = 'exits-{raised}'")
    assert dict(zip(steps["key"], steps["status"], strict=True))["1"] == "failed"
    assert "running" not in set(steps["status"])


def test_an_item_that_failed_on_a_worker_that_died_before_answering_fails_the_map(
    postgres_url: str, client: Any, tmp_path: Any
) -> None:
    """The worker records the item's step failed, then dies before its answer leaves (an
    OOM kill at that moment; here the exception's pickling ends the process). Dask runs
    the item on the other worker, which finds the step ended: the run fails with the
    item's error, it does not suspend as if someone had stopped it."""
    import kernelext as kx

    mark = str(tmp_path / "died")

    def die_once(path: str) -> BaseException:
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(9)
        return ValueError("bad row")

    class DiesWhenSent(Exception):
        def __reduce__(self) -> Any:
            return (die_once, (mark,))

    def fn(value: int) -> int:
        if value == 1:
            raise DiesWhenSent("bad row")
        return value

    kx.configure(store=postgres_url)

    @kx.agent(name="dies-after-failing")
    def agent(run: Any, items: list[int]) -> Any:
        return run.map(fn, items, concurrency=2, executor=client)

    handle = agent.start([0, 1, 2], run_id="dies-after-failing")
    status = handle.wait(120)
    assert os.path.exists(mark)  # the first attempt's worker did die
    assert status == "failed"
    assert isinstance(handle.error, kx.ItemFailed)
    assert handle.error.key == "1"
    assert "DiesWhenSent: bad row" in str(handle.error)
    events = kx.sql("SELECT kind FROM events WHERE run_id = 'dies-after-failing'")
    assert "suspended" not in set(events["kind"])
