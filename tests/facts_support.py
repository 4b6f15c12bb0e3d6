"""Agents, checks and a tiny "outside world" for the facts / credentials / revalidation tests.

Importable by name in a fresh process (the tests put tests/ on PYTHONPATH), so that a
resume there finds ``facts_support:get_price`` the way a user's module would be found.
The world is a JSON file named by ``KX_TEST_WORLD``; effects append to ``<world>.log``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store

RELEASE_HANGING = threading.Event()
CALLS: list[tuple[str, Any]] = []  # (what, argument) in call order, this process only


def world_path() -> Path:
    return Path(os.environ["KX_TEST_WORLD"])


def world() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(world_path().read_text())
    return data


def set_world(**changes: Any) -> None:
    data = world() if world_path().exists() else {}
    data.update(changes)
    world_path().write_text(json.dumps(data))


def log() -> list[dict[str, Any]]:
    path = world_path().with_suffix(".log")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _append_log(entry: dict[str, Any]) -> None:
    with world_path().with_suffix(".log").open("a") as handle:
        handle.write(json.dumps(entry) + "\n")


# -- checks (module level: resolvable by name in a fresh process) ----------------------
def get_price(sku: str) -> float:
    CALLS.append(("check", sku))
    return float(world()["prices"][sku])


def get_stock(sku: str) -> int:
    return int(world()["stock"][sku])


def failing_check(sku: str) -> float:
    raise ConnectionError(f"price service unreachable for {sku}")


def hanging_check(sku: str) -> float:
    RELEASE_HANGING.wait(120)
    return 0.0


def within_percent(recorded: float, current: float) -> bool:
    return abs(current - recorded) <= 0.05 * abs(recorded)


def get_token() -> str:
    CALLS.append(("refresh", None))
    data = world()
    if data.get("token_fails"):
        raise PermissionError("token endpoint answered 401")
    return str(data["token"])


kx.checks.register("stock:*", get_stock)
kx.credentials.register("api_token", refresh=get_token)


# -- an effect on the outside world ---------------------------------------------------------
@kx.effect
def reserve(sku: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
    crash_on = world().get("crash_on")
    if crash_on == sku:
        sys.stdout.flush()
        os._exit(3)  # the process dies mid-effect: its intent is recorded, its outcome not
    _append_log({"sku": sku, "key": idempotency_key})
    return {"reserved": sku}


# -- agents ---------------------------------------------------------------------------------
def _check_for(mode: str) -> dict[str, Any]:
    if mode == "named":
        return {"check": get_price}
    if mode == "lambda":
        return {"check": lambda sku: get_price(sku)}
    if mode == "raises":
        return {"check": failing_check}
    if mode == "hangs":
        return {"check": hanging_check}
    if mode == "tolerance":
        return {"check": get_price, "tolerance": 0.5}
    if mode == "compare":
        return {"check": get_price, "compare": within_percent}
    raise ValueError(mode)


@kx.agent(name="facts-pricing")
def pricing(
    run: kx.Run, skus: list[str], mode: str = "named", stop_after: str | None = None
) -> float:
    """One step per sku: record its price as a fact, reserve it, add the price up."""
    for sku in run.steps(skus, key=str):
        CALLS.append(("step", sku))
        price = run.fact("price:" + sku, get_price(sku), args=(sku,), **_check_for(mode))
        reserve(sku)
        run.state["total"] = run.state.get("total", 0.0) + price
        run.state.setdefault("seen", []).append(sku)
        if sku == stop_after:
            run.suspend("user_stop")
    return float(run.state["total"])


@kx.agent(name="facts-stock")
def stock(run: kx.Run, skus: list[str], stop_after: str | None = None) -> int:
    """Facts checked through the registry (kx.checks.register('stock:*', ...))."""
    for sku in run.steps(skus, key=str):
        run.fact("stock:" + sku, get_stock(sku), args=(sku,))
        if sku == stop_after:
            run.suspend("user_stop")
    return len(skus)


@kx.agent(name="facts-credential")
def with_token(
    run: kx.Run, skus: list[str], stop_after: str | None = None, via_check: bool = False
) -> int:
    """Records a credential in the first step; later steps use run.credential()."""
    with run.step("login"):
        CALLS.append(("step", "login"))
        run.fact(
            "api_token", get_token(), check=get_token if via_check else None, kind="credential"
        )
        run.state["logged_in"] = True
    for sku in run.steps(skus, key=str):
        CALLS.append(("step", sku))
        used = run.credential("api_token")
        run.state["uses"] = run.state.get("uses", 0) + 1
        _append_log({"sku": sku, "token": used})
        if sku == stop_after:
            run.suspend("user_stop")
    return int(run.state["uses"])


@kx.agent(name="facts-claims")
def with_claim(run: kx.Run, skus: list[str], stop_after: str | None = None) -> None:
    run.claim("budget:pricing", 10.0)
    for sku in run.steps(skus, key=str):
        run.fact("price:" + sku, get_price(sku), check=get_price, args=(sku,))
        if sku == stop_after:
            run.suspend("user_stop")


# -- driving a fresh process ------------------------------------------------------------------
def main(argv: list[str]) -> None:
    """``main([STORE, ACTION, RUN_ID, JSON?])`` in a fresh process; prints one JSON line.

    Run it as ``python -c "import facts_support, sys; facts_support.main(sys.argv[1:])"``
    so that this module keeps its name (with ``-m`` it would be ``__main__``).
    """
    store_path, action, run_id = argv[:3]
    store = kx.open_store(store_path)
    out: dict[str, Any] = {}
    try:
        if action == "start":
            spec = json.loads(argv[3])
            agent = runtime().agents[spec.pop("agent")]
            handle = agent.start(run_id=run_id, store=store, **spec)
            out["status"] = handle.wait(60)
        elif action == "resume":
            handle = kx.resume(run_id, store=store)
            out["status"] = handle.wait(60)
            out["result"] = handle.result
        elif action == "accept":
            handle = kx.revalidation(run_id, store=store).accept(note="fresh process")
            out["status"] = handle.wait(60)
            out["result"] = handle.result
        out["calls"] = [list(c) for c in CALLS]
    except kx.KernelextError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["status"] = store.get_run(run_id)["status"]
    finally:
        store.close()
    print(json.dumps(out))


# -- helpers for the tests (parent process) ----------------------------------------------------
def run_fresh(
    store_path: Path | str,
    action: str,
    run_id: str,
    spec: dict[str, Any] | None = None,
    timeout: float = 120,
) -> dict[str, Any]:
    """Run ``main`` in a fresh interpreter; returns its JSON line (or exit code + stderr)."""
    import subprocess  # only the parent process needs it

    env = dict(os.environ)
    tests_dir = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests_dir, env.get("PYTHONPATH")) if p)
    argv = [str(store_path), action, run_id] + ([json.dumps(spec)] if spec is not None else [])
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, facts_support; facts_support.main(sys.argv[1:])",
            *argv,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"returncode": done.returncode, "stderr": done.stderr[-3000:]}
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr"] = done.stderr
    return result


@contextlib.contextmanager
def reopened(store_path: Path | str) -> Iterator[Store]:
    """Open the store again (after a fresh process used it) and close it afterwards."""
    store = open_store(str(store_path))
    try:
        yield store
    finally:
        store.close()


def event_kinds(store: Any, run_id: str) -> list[str]:
    return [str(e["kind"]) for e in store.events(run_id)]


def fact_rows(store: Any, run_id: str) -> dict[str, dict[str, Any]]:
    return {str(r["name"]): r for r in store.facts(run_id)}
