"""A plain-Python demo: start an agent, stop it mid-run, resume it, show the store.

Run it with ``make demo``. It uses a throwaway store in a temporary folder.
"""

from __future__ import annotations

import os
import tempfile
import time

import kernelext as kx

OUTBOX: list[str] = []


@kx.effect
def send_email(to: str, body: str, *, idempotency_key: str | None = None) -> dict[str, str]:
    """Stands in for an email API that accepts an idempotency key."""
    OUTBOX.append(f"{to}: {body} [{idempotency_key}]")
    time.sleep(0.02)
    return {"to": to, "status": "sent"}


@kx.agent(name="triage", max_step_seconds=5)
def triage(run: kx.Run, tickets: list[dict[str, str]]) -> int:
    for ticket in run.steps(tickets, key=lambda t: t["id"]):
        send_email(ticket["owner"], f"ticket {ticket['id']} triaged")
        run.state["handled"] = run.state.get("handled", 0) + 1
        time.sleep(0.05)
    return int(run.state["handled"])


def main() -> None:
    folder = tempfile.mkdtemp(prefix="kernelext-demo-")
    kx.open_store(os.path.join(folder, "demo.duckdb"))
    tickets = [{"id": f"T{i}", "owner": f"owner{i}@example.com"} for i in range(12)]

    handle = triage.start(tickets, run_id="triage-demo")
    time.sleep(0.35)
    print(f"Stop pressed -> {handle.stop(source='demo')}")
    print(f"After the safe point -> {handle.wait()}, emails sent so far: {len(OUTBOX)}")

    handle = kx.resume("triage-demo")
    print(f"Resumed -> {handle.wait()}, emails sent in all: {len(OUTBOX)} (no repeats)")

    print("\nSteps:")
    print(
        kx.sql(
            "SELECT ordinal, key, status, round(duration_s, 3) AS seconds FROM steps "
            "WHERE run_id = 'triage-demo' ORDER BY started_at"
        ).to_string(index=False)
        if hasattr(kx.sql("SELECT 1"), "to_string")
        else kx.sql("SELECT ordinal, key, status FROM steps ORDER BY started_at")
    )
    print("\nEvents:")
    events = kx.sql(
        "SELECT id, kind, from_status, to_status, source, reason FROM events "
        "WHERE run_id = 'triage-demo' ORDER BY id"
    )
    print(events.to_string(index=False) if hasattr(events, "to_string") else events)
    print("\nLedger:")
    ledger = kx.sql("SELECT tool, status, count(*) AS calls FROM effects GROUP BY ALL")
    print(ledger.to_string(index=False) if hasattr(ledger, "to_string") else ledger)
    assert len(OUTBOX) == len(tickets), "an email was sent twice or not at all"


if __name__ == "__main__":
    main()
