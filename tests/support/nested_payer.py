"""An agent whose recorded call makes recorded calls of its own, built the same way in every
process (tests/people/test_nested_approvals.py).

``transfer(to, amount)`` is an ``@kx.effect`` that tells the payee (``notify``, a plain
effect) and then pays (``pay``, ``needs_approval=True``); both POST to the local delivery
server at ``URL["delivery"]``, which counts what arrived. The agent ``nested-payer`` makes
one transfer in one step.

``python -m support.nested_payer resume STORE RUN_ID DELIVERY_URL``: resumes the run in a
process of its own (a restarted kernel) and prints its end as one JSON line.
"""

from __future__ import annotations

from typing import Any

import kernelext as kx
from support.http_server import post_json

__all__ = ["URL", "nested_payer", "notify", "pay", "transfer"]

URL = {"delivery": ""}


@kx.effect
def notify(to: str) -> Any:
    return post_json(f"{URL['delivery']}/notify", {"to": to}).body


@kx.effect(needs_approval=True)
def pay(to: str, amount: int) -> Any:
    return post_json(f"{URL['delivery']}/pay", {"to": to, "amount": amount}).body


@kx.effect
def transfer(to: str, amount: int) -> Any:
    notify(to)
    return pay(to, amount)["delivery"]


@kx.agent(name="nested-payer")
def nested_payer(run: kx.Run, to: str, amount: int) -> Any:
    with run.step("transfer"):
        run.state["delivery"] = transfer(to, amount)
    return run.state["delivery"]


def main(argv: list[str]) -> int:
    import json

    verb, store, run_id, url = argv
    assert verb == "resume", verb
    URL["delivery"] = url
    kx.configure(store=store)
    handle = kx.resume(run_id)
    handle.wait(timeout=60)
    print(json.dumps({"status": str(handle.status), "result": handle.result}), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
