"""A worker process for the PostgreSQL concurrency test (tests/store/test_postgres.py).

``python tests/support/pg_worker.py ROLE CONFIG_JSON``. The process imports
kernelext, opens the shared store, prints ``ready`` and waits for one line on stdin
(so that every worker starts at the same moment), then plays its role and prints
one JSON line with what it did:

- ``runner``: starts its runs (each step posts one effect to the delivery server),
  then resumes every user-stopped run it finds (any runner may resume any run; the
  liveness lease lets one win) until every normal run is completed.
- ``stopper``: for ``duration`` seconds, asks random runs to stop (``kx.stop``),
  counting every request per run.
- ``sweeper``: sweeps until every expiry run has expired, then a little longer.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernelext as kx
from kernelext.errors import RunNotFound, RunStateError
from support.http_server import post_json

CONFIG: dict[str, Any] = {}
STORE: list[Any] = []  # the store this process opened (the default store too)


@kx.effect
def deliver(run_id: str, step: int, *, idempotency_key: str | None = None) -> dict[str, Any]:
    response = post_json(
        CONFIG["server"] + f"/deliver/{run_id}",
        {"run": run_id, "step": step},
        idempotency_key=idempotency_key,
    )
    if response.status != 200:
        raise RuntimeError(f"delivery failed with HTTP {response.status}")
    return {"delivery": response.body["delivery"]}


@kx.agent(name="pg-steady")
def steady(run: kx.Run, steps: int, pause: float) -> int:
    for step in run.steps(range(steps)):
        deliver(run.id, step)
        run.state["done"] = run.state.get("done", 0) + 1
        time.sleep(pause)
    return int(run.state["done"])


@kx.agent(name="pg-approval")
def approval(run: kx.Run, steps: int, pause: float) -> None:
    for step in run.steps(range(steps)):
        deliver(run.id, step)
        time.sleep(pause)
    run.suspend("approval", deadline=1.0)  # nobody approves: the sweepers expire it


def runner(config: dict[str, Any]) -> dict[str, Any]:
    handles = []
    for run_id in config["start"]:
        handles.append(steady.start(config["steps"], config["pause"], run_id=run_id))
    for run_id in config["expire"]:
        handles.append(approval.start(3, config["pause"], run_id=run_id))
    store = STORE[0]
    resumed: dict[str, int] = {}
    conflicts = 0
    rng = random.Random(config["seed"])
    watched = list(config["all_normal"]) + list(config["all_expire"])
    give_up = time.monotonic() + config["timeout"]
    while time.monotonic() < give_up:
        rows = {r: store.find_run(r) for r in watched}
        if all(rows[r] and rows[r]["status"] == "completed" for r in config["all_normal"]):
            break
        for run_id in rng.sample(watched, len(watched)):
            row = rows[run_id]
            if row and row["status"] == "suspended" and row["reason"] == "user_stop":
                try:
                    handles.append(kx.resume(run_id, source=config["name"]))
                except RunStateError:  # another runner took it first, or it is live
                    conflicts += 1
                    continue
                resumed[run_id] = resumed.get(run_id, 0) + 1
        time.sleep(rng.uniform(0.01, 0.04))
    for handle in handles:
        handle.wait(60)
    return {"resumed": resumed, "conflicts": conflicts}


def stopper(config: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(config["seed"])
    stops: dict[str, int] = {}
    end = time.monotonic() + config["duration"]
    while time.monotonic() < end:
        run_id = rng.choice(config["targets"])
        try:
            kx.stop(run_id, source=config["name"], store=STORE[0])
        except RunNotFound:  # its runner has not created it yet: nothing was recorded
            continue
        finally:
            time.sleep(rng.uniform(0.05, 0.25))
        stops[run_id] = stops.get(run_id, 0) + 1
    return {"stops": stops}


def sweeper(config: dict[str, Any]) -> dict[str, Any]:
    store = STORE[0]
    expired: list[str] = []
    sweeps = busy = 0
    give_up = time.monotonic() + config["timeout"]
    linger_until: float | None = None
    while time.monotonic() < give_up:
        result = kx.sweep(store=store, source=config["name"])
        sweeps += 1
        busy += bool(result.busy)
        expired += result.expired_ids
        if linger_until is None:
            statuses = [store.find_run(r) for r in config["all_expire"]]
            if all(row and row["status"] == "expired" for row in statuses):
                linger_until = time.monotonic() + 0.5  # a few more sweeps: nothing may expire twice
        elif time.monotonic() > linger_until:
            break
        time.sleep(0.005)
    return {"expired": expired, "sweeps": sweeps, "busy": busy}


def main() -> int:
    role, raw = sys.argv[1], sys.argv[2]
    CONFIG.update(json.loads(raw))
    STORE.append(kx.open_store(CONFIG["store"]))
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 0
    result = {"runner": runner, "stopper": stopper, "sweeper": sweeper}[role](CONFIG)
    print(json.dumps({"role": role, "name": CONFIG["name"], **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
