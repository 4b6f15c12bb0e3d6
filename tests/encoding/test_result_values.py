"""Values a run gets back round-trip exactly: item results, effect results replayed from the
ledger, facts. No name is guessed in them (``session_id``, ``auth_method``, ``password``
come back as computed); only registered secrets (``kx.secrets.register(value)`` and
``register(name=...)``) are masked in what is stored. Against a real DuckDB file.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.live import name, wait_until

import kernelext as kx
from kernelext._core.encoding.keys import load_result, stored_result
from kernelext._core.encoding.secrets import MASK, REDACTED, SECRETS, is_secret_name
from kernelext._store import Store
from kernelext._store.columns import scrub_params
from kernelext._store.record_door import scrub_record

WAIT = 60.0

# Names the display masks (is_secret_name): none of them may change a value a run gets back.
SECRET_LOOKING = [
    "auth_method", "session_id", "credential_type", "password", "passwd", "pwd", "secret",
    "token", "access_token", "api_key", "apiKey", "X-Api-Key", "client_secret", "cookie",
    "authorization", "signature", "private_key", "session", "auth", "bearer", "passphrase",
    "refresh_token", "sessionToken", "AWS_SECRET_ACCESS_KEY", "credentials", "oauth",
]  # fmt: skip


def _value(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "auth_method": "oauth",
        "session_id": f"s-{i}",
        "credential_type": "service-account",
        "password_policy": {"password": f"pw-{i}", "min_length": 12},
        "dsn": f"postgresql://app:hunter{i}@db/app",
        "note": f"token=abc{i} Bearer xyz{i}",
    }


def test_secret_looking_names_are_names_the_display_masks() -> None:
    assert all(is_secret_name(n) for n in SECRET_LOOKING)


def test_a_stopped_and_resumed_map_returns_the_values_it_computed(
    store: Store, store_path: Path
) -> None:
    gate = threading.Event()
    started: list[int] = []

    def one(i: int) -> dict[str, Any]:
        started.append(i)
        if i == 3:
            gate.wait(WAIT)
        return _value(i)

    @kx.agent(name=name("values"))
    def values(run: kx.Run, n: int) -> list[Any]:
        return run.map(one, range(n), concurrency=1)

    handle = values.start(8)
    wait_until(lambda: 3 in started, "item 3 running")
    handle.stop()
    gate.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    done_before = sum(s["status"] == "completed" for s in store.steps(handle.run_id))
    assert done_before >= 3  # items 0..2 come back from the store on resume
    started.clear()
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert min(started) >= 3  # the completed items did not run again
    assert again.result == [_value(i) for i in range(8)]
    for row in store.steps(handle.run_id):  # what the store holds is the value itself
        if row.get("result") is not None:
            assert load_result(row["result"]) == _value(int(row["key"]))


def test_an_effect_result_replayed_from_the_ledger_is_the_result_it_returned(
    store: Store,
) -> None:
    calls: list[int] = []
    fail_once = {"armed": True}

    @kx.effect(name=name("login"))
    def login(user: str) -> dict[str, Any]:
        calls.append(1)
        return {"session_id": "s-42", "auth": "basic", "access_token": "t-42", "user": user}

    def one(user: str) -> dict[str, Any]:
        result = login(user)
        if fail_once["armed"]:
            fail_once["armed"] = False
            raise RuntimeError("after the effect")
        return {"login": result}

    @kx.agent(name=name("replay"))
    def replay(run: kx.Run) -> list[Any]:
        return run.map(one, ["ann"], concurrency=1)

    handle = replay.start()
    assert handle.wait(WAIT) == "failed"
    again = kx.resume(handle.run_id)
    assert again.wait(WAIT) == "completed", again.error
    assert len(calls) == 1  # replayed from the ledger, not called again
    expected = {"session_id": "s-42", "auth": "basic", "access_token": "t-42", "user": "ann"}
    assert again.result == [{"login": expected}]
    (effect,) = store.load_effects(handle.run_id).values()
    assert load_result(effect["result"]) == expected


def login_state() -> dict[str, Any]:
    """A fact's check (module level: found by name on resume)."""
    return {"session_id": "s-1", "auth_method": "basic", "credential_type": "user"}


def test_a_fact_with_secret_looking_keys_is_rechecked_against_its_real_value(
    store: Store,
) -> None:
    gate = threading.Event()
    reached: list[str] = []

    @kx.agent(name=name("fact-values"))
    def facts(run: kx.Run) -> Any:
        for step in run.steps(["login", "work"]):
            if step == "login":
                run.state["login"] = run.fact("login", login_state(), check=login_state)
            else:
                reached.append(step)
                gate.wait(WAIT)
        return run.state["login"]

    handle = facts.start()
    wait_until(lambda: reached == ["work"], "step work running")
    handle.stop()
    gate.set()
    assert handle.wait(WAIT) == "suspended", handle.error
    again = kx.resume(handle.run_id)  # the recorded value is the real one: no contradiction
    assert again.wait(WAIT) == "completed", again.error
    assert again.result == login_state()


def test_registered_secrets_are_still_masked_in_stored_results(store: Store) -> None:
    secret = SECRETS.register("sk-live-0123456789")
    SECRETS.register(name="x_sig")
    try:

        def one(i: int) -> dict[str, Any]:
            return {"key_text": f"key {secret}", "x_sig": "abc", "session_id": "kept"}

        @kx.agent(name=name("masked"))
        def masked(run: kx.Run) -> list[Any]:
            return run.map(one, [0], concurrency=1)

        handle = masked.start()
        assert handle.wait(WAIT) == "completed", handle.error
        (row,) = store.steps(handle.run_id)
        assert secret not in row["result"]
        assert load_result(row["result"]) == {
            "key_text": f"key {MASK}",
            "x_sig": REDACTED,
            "session_id": "kept",
        }
    finally:
        SECRETS.forget(secret)
        SECRETS.forget(name="x_sig")


_names = st.one_of(
    st.sampled_from(SECRET_LOOKING),
    st.builds(
        lambda a, b: f"{a}_{b}",
        st.sampled_from(SECRET_LOOKING),
        st.sampled_from(["id", "type", "x"]),
    ),
)
_leaves = st.one_of(
    st.text(max_size=20), st.integers(), st.booleans(), st.none(),
    st.builds(
        lambda w: f"{w}=v1 Bearer abcdef postgresql://u:p@h/db", st.sampled_from(SECRET_LOOKING)
    ),
)  # fmt: skip
_results = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_names, inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(_results)
def test_a_result_passes_the_store_door_unchanged(value: Any) -> None:
    """Whatever its key names, a result is stored (encoded, then through the column door and
    the journal's record door) as the value it was."""
    encoded = stored_result(value)
    (through,) = scrub_params("UPDATE steps SET result = ? WHERE id = ?", [encoded, "x"])[:1]
    assert load_result(through) == value
    record = scrub_record("item_complete", {"run_id": "r", "result": encoded})
    assert load_result(record["result"]) == value
    effect = scrub_record("outcome", {"status": "applied", "result": encoded, "error": None})
    assert json.loads(effect["result"]) == json.loads(encoded)


def test_kernelext_show_masks_a_result_by_name_for_display_only(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from kernelext._cli.runs import cmd_show

    @kx.effect(name=name("open_session"))
    def open_session() -> dict[str, Any]:
        return {"session_id": "s-4242", "user": "ann"}

    @kx.agent(name=name("shown"))
    def shown(run: kx.Run) -> Any:
        return open_session()

    handle = shown.start()
    assert handle.wait(WAIT) == "completed", handle.error
    assert handle.result == {"session_id": "s-4242", "user": "ann"}
    cmd_show(argparse.Namespace(run_id=handle.run_id, json=False), store)
    text = capsys.readouterr().out
    assert "s-4242" not in text and REDACTED in text
    (effect,) = store.load_effects(handle.run_id).values()
    assert load_result(effect["result"]) == {"session_id": "s-4242", "user": "ann"}


def test_effect_arguments_shown_to_people_still_mask_by_name() -> None:
    from kernelext._core.encoding.keys import display_args

    shown = json.loads(display_args({"session_id": "s-1", "user": "ann"}))
    assert shown == {"session_id": REDACTED, "user": "ann"}


@pytest.fixture(autouse=True)
def _no_registered_leftovers() -> Any:
    before = len(SECRETS)
    yield
    assert len(SECRETS) == before
