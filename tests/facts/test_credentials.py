"""Credentials: never stored, refreshed first thing on resume, a failed refresh stops it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import facts_support as fs
import pytest

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext._store import Store, open_store

TABLES = ("runs", "steps", "snapshots", "blobs", "effects", "facts", "claims", "events")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "world.json"
    monkeypatch.setenv("KX_TEST_WORLD", str(path))
    fs.set_world(prices={"A": 10.0}, token="secret-token-one")
    fs.CALLS.clear()
    fs.RELEASE_HANGING.clear()
    yield path
    fs.RELEASE_HANGING.set()  # lets an abandoned hanging check finish
    fs.CALLS.clear()
    kx.credentials.register("api_token", refresh=fs.get_token)  # as facts_support has it


@pytest.fixture
def store(store_path: Path, world: Path) -> Iterator[Store]:
    opened = open_store(str(store_path))
    yield opened
    opened.close()


def suspended(store: Store, run_id: str, **options: object) -> None:
    handle = fs.with_token.start(
        ["A", "B", "C"], run_id=run_id, store=store, stop_after="A", **options
    )
    assert handle.wait(30) == "suspended"


def stored_text(store: Store) -> str:
    """Every value of every table, as text (blobs decoded), to look for secrets."""
    parts: list[str] = []
    for table in TABLES:
        for row in store.read(f"SELECT * FROM {table}"):
            for value in row:
                if isinstance(value, (bytes, bytearray)):
                    parts.append(bytes(value).decode("utf-8", "replace"))
                else:
                    parts.append(str(value))
    return "\n".join(parts)


def test_credential_value_is_never_stored_only_its_fingerprint(store: Store) -> None:
    suspended(store, "cred")
    row = fs.fact_rows(store, "cred")["api_token"]
    assert row["kind"] == "credential"
    assert row["value"] is None
    assert row["fingerprint"].startswith("sha256:")
    assert len(row["fingerprint"]) == len("sha256:") + 16
    assert "secret-token-one" not in stored_text(store)


def test_refresh_runs_before_anything_and_the_run_uses_the_fresh_value(store: Store) -> None:
    suspended(store, "fresh-token")
    before = fs.fact_rows(store, "fresh-token")["api_token"]["fingerprint"]
    fs.set_world(token="secret-token-two")
    fs.CALLS.clear()
    handle = kx.resume("fresh-token", store=store)
    assert handle.wait(30) == "completed"
    assert fs.CALLS[0] == ("refresh", None)  # before any step body
    assert [e["token"] for e in fs.log()] == [
        "secret-token-one",
        "secret-token-two",
        "secret-token-two",
    ]
    row = fs.fact_rows(store, "fresh-token")["api_token"]
    assert row["check_status"] == "refreshed"
    assert row["check_detail"] == "changed"
    assert row["fingerprint"] != before
    assert "credentials_refreshed" in fs.event_kinds(store, "fresh-token")
    assert "secret-token-two" not in stored_text(store)


def test_refresh_in_a_fresh_process(store: Store, store_path: Path) -> None:
    suspended(store, "fresh-proc")
    store.close()
    fs.set_world(token="secret-token-three")
    out = fs.run_fresh(store_path, "resume", "fresh-proc")
    assert out.get("status") == "completed", out
    assert out["calls"][0] == ["refresh", None]
    assert [e["token"] for e in fs.log()][1:] == ["secret-token-three"] * 2


def test_a_failing_refresh_stops_the_resume_and_the_run_stays_suspended(store: Store) -> None:
    suspended(store, "bad-refresh")
    steps_before = len(store.steps("bad-refresh"))
    fs.set_world(token_fails=True)
    fs.CALLS.clear()
    before = store.now()
    with pytest.raises(kx.CredentialError, match="'api_token': PermissionError: token endpoint"):
        kx.resume("bad-refresh", store=store)
    run = store.get_run("bad-refresh")
    assert run["status"] == "suspended" and run["reason"] == "error"
    # Still a pause with a deadline, set from the ``error`` policy when the resume failed.
    error_policy = runtime().settings.expiry.durations["error"]
    assert before + error_policy <= run["deadline"] <= store.now() + error_policy
    assert [c for c in fs.CALLS if c[0] == "step"] == []
    assert len(store.steps("bad-refresh")) == steps_before
    row = fs.fact_rows(store, "bad-refresh")["api_token"]
    assert row["check_status"] == "error"
    kinds = fs.event_kinds(store, "bad-refresh")
    assert kinds[-2:] == ["credentials_refreshed", "resume_failed"]
    # Fixed: the same run resumes and finishes.
    fs.set_world(token_fails=False, token="secret-token-four")
    handle = kx.resume("bad-refresh", store=store)
    assert handle.wait(30) == "completed"


def test_a_missing_refresh_stops_the_resume(store: Store) -> None:
    suspended(store, "no-refresh")
    kx.credentials.unregister("api_token")
    with pytest.raises(kx.CredentialError, match=r"kx.credentials.register\('api_token'"):
        kx.resume("no-refresh", store=store)
    assert store.get_run("no-refresh")["status"] == "suspended"
    assert fs.fact_rows(store, "no-refresh")["api_token"]["check_status"] == "unresolved"


def test_a_hanging_refresh_is_time_bounded(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    suspended(store, "slow-refresh")
    kx.credentials.register("api_token", refresh=lambda: fs.hanging_check("token"))
    saved = runtime().settings.check_timeout
    runtime().settings.check_timeout = 0.3
    try:
        with pytest.raises(kx.CredentialError, match=r"no answer within 300 ms"):
            kx.resume("slow-refresh", store=store)
    finally:
        runtime().settings.check_timeout = saved
        fs.RELEASE_HANGING.set()
    assert store.get_run("slow-refresh")["status"] == "suspended"


def test_the_fact_check_serves_as_refresh_when_none_is_registered(store: Store) -> None:
    kx.credentials.unregister("api_token")
    suspended(store, "via-check", via_check=True)
    assert fs.fact_rows(store, "via-check")["api_token"]["check_name"] == "facts_support:get_token"
    fs.set_world(token="secret-token-five")
    handle = kx.resume("via-check", store=store)
    assert handle.wait(30) == "completed"
    assert fs.log()[-1]["token"] == "secret-token-five"


def test_run_credential_without_a_recorded_credential_says_what_to_do(store: Store) -> None:
    @kx.agent(name="facts-no-cred")
    def no_cred(run: kx.Run) -> None:
        run.credential("missing")

    handle = no_cred.start(run_id="no-cred", store=store)
    assert handle.wait(30) == "failed"
    assert isinstance(handle.error, kx.CredentialError)
    assert "run.fact('missing', value, kind='credential')" in str(handle.error)
