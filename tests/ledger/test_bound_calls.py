"""Calls bound by value, names checked at the API, runs of an earlier release, results that
round-trip (issue 19 items 2, 5, 7), on real runs.

Payments and mails go to the real local HTTP server (``delivery_server``), which counts
every delivery: "not sent", "sent once" are read from the receiving side.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import pathlib
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pydantic
import pytest
from support.http_server import DeliveryServer, post_json
from support.live import name

import kernelext as kx
from kernelext._core.encoding.keys import args_hash, effect_key
from kernelext._core.lifecycle.cell_runs import open_cell_run
from kernelext._store import Store
from kernelext.errors import InvalidName, UnencodableArgument

WAIT = 60.0


class Tier(enum.Enum):
    GOLD = "gold"
    SILVER = "silver"


@dataclasses.dataclass
class Amount:
    value: int
    currency: str


class Money(pydantic.BaseModel):
    value: int
    currency: str


def tz(hours: int) -> dt.timezone:
    return dt.timezone(dt.timedelta(hours=hours))


# (approved value, the value the resumed call brings instead): same type, other value.
PAIRS: dict[str, tuple[Any, Any]] = {
    "decimal": (Decimal("10"), Decimal("9999999")),
    "bytes": (b"ten", b"9999999"),
    "datetime": (
        dt.datetime(2026, 1, 1, 9, tzinfo=tz(0)),
        dt.datetime(2026, 1, 1, 9, tzinfo=tz(2)),
    ),
    "naive-datetime": (dt.datetime(2026, 1, 1, 9), dt.datetime(2026, 1, 1, 9, 0, 1)),
    "date": (dt.date(2026, 1, 1), dt.date(2026, 1, 2)),
    "time": (dt.time(9), dt.time(21)),
    "timedelta": (dt.timedelta(days=1), dt.timedelta(days=100)),
    "set": ({"ann"}, {"ann", "mallory"}),
    "frozenset": (frozenset({1}), frozenset({1, 2})),
    "tuple": ((1, 2), (1, 3)),
    "uuid": (uuid.UUID(int=1), uuid.UUID(int=2)),
    "path": (pathlib.Path("/srv/a"), pathlib.Path("/srv/b")),
    "enum": (Tier.SILVER, Tier.GOLD),
    "dataclass": (Amount(10, "EUR"), Amount(9999999, "EUR")),
    "pydantic": (Money(value=10, currency="EUR"), Money(value=9999999, currency="EUR")),
    "numpy-scalar": (np.int64(10), np.int64(9999999)),
    "numpy-dtype": (np.float64(10), np.float32(10)),
    "numpy-array": (np.array([10, 20]), np.array([10, 9999999])),
    "pandas-timestamp": (
        pd.Timestamp("2026-01-01", tz="UTC"),
        pd.Timestamp("2026-01-02", tz="UTC"),
    ),
    "dataframe": (pd.DataFrame({"amount": [10]}), pd.DataFrame({"amount": [9999999]})),
    "series": (pd.Series([10]), pd.Series([9999999])),
    "arrow": (pa.table({"amount": [10]}), pa.table({"amount": [9999999]})),
    "float-vs-int": (10, 10.0),
    "nested": ({"to": ["bob", Decimal("1")]}, {"to": ["bob", Decimal("2")]}),
}


def payer(server: DeliveryServer, plan: dict[str, Any]) -> kx.Agent:
    @kx.effect(needs_approval=True)
    def pay(to: str, amount: Any, *, idempotency_key: str | None = None) -> Any:
        body = {"to": to, "amount": repr(amount)}
        return post_json(server.url + "/pay", body, idempotency_key=idempotency_key).body

    @kx.agent(name=name("bound-payer"))
    def agent(run: kx.Run) -> None:
        with run.step("bob"):
            pay("bob", plan["amount"])

    return agent


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_an_approval_is_bound_to_the_value_of_each_argument_type(
    kind: str, store: Store, delivery_server: DeliveryServer
) -> None:
    approved, other = PAIRS[kind]
    plan = {"amount": approved}
    run_id = name("bound-" + kind)
    assert payer(delivery_server, plan).start(run_id=run_id).wait(WAIT) == "suspended"
    [first] = kx.approvals(run_id)
    shown = first.arguments["amount"]
    placeholder = f"<{type(approved).__module__}.{type(approved).__qualname__}>"
    assert placeholder not in json.dumps(shown), f"the approver must see the value: {shown}"
    assert first.approve(resume=False) is None
    plan["amount"] = other  # the resumed call brings another value of the same type
    assert kx.resume(run_id).wait(WAIT) == "suspended"
    assert delivery_server.count() == 0, "the approval of another value was consumed"
    [second] = kx.approvals(run_id)
    assert second.id != first.id and second.key == first.key
    assert json.dumps(second.arguments["amount"]) != json.dumps(shown)
    assert second.approve().wait(WAIT) == "completed"
    assert [d["body"]["amount"] for d in delivery_server.deliveries] == [repr(other)]


def test_the_approver_sees_values_tagged_not_type_names(store: Store) -> None:
    from kernelext._core.encoding.keys import display_args

    text = display_args(
        {"amount": Decimal("10"), "at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}
    )
    assert json.loads(text) == {
        "amount": {"$kx": "decimal", "v": "10"},
        "at": {"$kx": "datetime", "v": "2026-01-01T00:00:00+00:00"},
    }


def test_an_argument_that_cannot_be_bound_is_refused_before_anything_is_recorded(
    store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect
    def send(to: str, client: Any) -> Any:
        return post_json(delivery_server.url + "/send", {"to": to}).body

    deep: Any = "x"
    for _ in range(500):
        deep = [deep]

    @kx.agent(name=name("unbound"))
    def agent(run: kx.Run, which: str) -> None:
        with run.step("s"):
            send("ann", object() if which == "object" else deep)

    for which in ("object", "deep"):
        run_id = name("unbound-" + which)
        handle = agent.start(which, run_id=run_id)
        assert handle.wait(WAIT) == "failed"
        assert isinstance(handle.error, UnencodableArgument), handle.error
        assert "client" in str(handle.error) and "send" in str(handle.error)
        assert kx.sql("SELECT count(*) AS n FROM effects WHERE run_id = ?", [run_id])["n"][0] == 0
    assert delivery_server.count() == 0


# -- names ---------------------------------------------------------------------------------
BAD_NAMES = ["a\0b", "caf\udce9", "", "   ", "x" * 1001, 7]


@pytest.mark.parametrize(
    "bad", BAD_NAMES, ids=["nul", "surrogate", "empty", "blank", "long", "int"]
)
def test_bad_run_ids_are_refused_at_every_entry_point(bad: Any, store: Store) -> None:
    @kx.agent(name=name("names"))
    def agent(run: kx.Run) -> None:
        with run.step("s"):
            pass

    with pytest.raises(InvalidName, match=r"run.id"):
        agent.start(run_id=bad)
    with pytest.raises(InvalidName, match=r"run.id"):
        kx.resume(bad)
    with pytest.raises(InvalidName, match=r"run.id"):
        open_cell_run(bad, store=store)
    good = name("names-good")
    assert agent.start(run_id=good).wait(WAIT) == "completed"
    with pytest.raises(InvalidName, match=r"new.run.id"):
        kx.restart(good, new_run_id=bad)
    assert [r["id"] for r in store.list_runs()] == [good]


@pytest.mark.parametrize("bad", BAD_NAMES[:5], ids=["nul", "surrogate", "empty", "blank", "long"])
def test_bad_step_keys_fail_the_run_before_the_step_is_recorded(
    bad: str, store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect
    def send(to: str) -> Any:
        return post_json(delivery_server.url + "/send", {"to": to}).body

    @kx.agent(name=name("keys"))
    def agent(run: kx.Run) -> None:
        for item in run.steps(["ok", "bad"], key=lambda i: bad if i == "bad" else i):
            send(item)

    run_id = name("keys")
    handle = agent.start(run_id=run_id)
    assert handle.wait(WAIT) == "failed"  # never completed without its step
    assert isinstance(handle.error, InvalidName)
    assert "step key" in str(handle.error) or "key=" in str(handle.error)
    assert [s["key"] for s in store.completed_steps(run_id)] == ["ok"]
    assert delivery_server.count() == 1
    with pytest.raises(InvalidName, match=r"name=|tool name"):
        kx.effect(name=bad)(lambda: None)


# -- runs recorded by an earlier release ---------------------------------------------------
def test_a_run_of_an_earlier_release_resumes_with_its_old_keys_and_repeats_nothing(
    store: Store, delivery_server: DeliveryServer
) -> None:
    stop_after = {"on": True}

    @kx.effect
    def mail(to: str, when: Any, *, idempotency_key: str | None = None) -> Any:
        return post_json(
            delivery_server.url + "/mail", {"to": to}, idempotency_key=idempotency_key
        ).body

    @kx.agent(name=name("legacy"))
    def agent(run: kx.Run) -> None:
        for to in run.steps(["ann", "bob"]):
            mail(to, Decimal("1.0"))
            if to == "bob" and stop_after["on"]:
                kx.stop(run.id)
                run.checkpoint()  # a stop mid-step: the step runs again on resume
            mail(to + "-2", Decimal("2.0"))

    run_id = name("legacy")
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    assert delivery_server.count() == 3  # ann, ann-2, bob

    # Rewrite the run as an earlier release recorded it: no key_scheme, NUL-joined keys,
    # type-name argument hashes.
    def as_scheme_1(tx: Any) -> None:
        tx.execute("UPDATE runs SET key_scheme = NULL WHERE id = ?", (run_id,))
        for row in store.load_effects(run_id).values():
            old_key = effect_key(run_id, row["step_key"], row["tool"], row["call_ordinal"], 1)
            to = json.loads(row["args"])["to"]
            digest = args_hash((to, Decimal("0")), {}, 1)  # scheme 1 hashed a type name
            tx.execute(
                "UPDATE effects SET key = ?, args_hash = ? WHERE key = ?",
                (old_key, digest, row["key"]),
            )

    keys_before = {r["key"] for r in store.load_effects(run_id).values()}
    store.write(as_scheme_1)
    keys_after = {r["key"] for r in store.load_effects(run_id).values()}
    assert not keys_before & keys_after
    stop_after["on"] = False
    assert kx.resume(run_id).wait(WAIT) == "completed"
    bodies = sorted(d["body"]["to"] for d in delivery_server.deliveries)
    assert bodies == ["ann", "ann-2", "bob", "bob-2"], "each delivery exactly once"
    assert store.get_run(run_id)["key_scheme"] is None  # it stays a scheme-1 run
    keys = {
        (r["step_key"], r["call_ordinal"]): r["key"] for r in store.load_effects(run_id).values()
    }
    assert keys[("1", 1)] == effect_key(run_id, "1", "mail", 1, 1)  # a new call: old scheme
    hashes = {
        (r["step_key"], r["call_ordinal"]): len(r["args_hash"])
        for r in store.load_effects(run_id).values()
    }
    # The rows of the earlier release keep their hashes; the call recorded now is bound by
    # value (a scheme-2 hash, 64 digits), so its approval could not take another amount.
    assert hashes == {("0", 0): 32, ("0", 1): 32, ("1", 0): 32, ("1", 1): 64}


def test_new_runs_record_key_scheme_2_and_a_restart_keeps_its_parents(store: Store) -> None:
    @kx.agent(name=name("scheme"))
    def agent(run: kx.Run) -> None:
        with run.step("s"):
            pass

    run_id = name("scheme")
    assert agent.start(run_id=run_id).wait(WAIT) == "completed"
    assert store.get_run(run_id)["key_scheme"] == 2
    child = kx.restart(run_id, from_step=0)
    assert child.wait(WAIT) == "completed"
    assert store.get_run(child.run.id)["key_scheme"] == 2


# -- results -------------------------------------------------------------------------------
def test_results_of_common_types_come_back_as_they_were_on_resume(
    store: Store, delivery_server: DeliveryServer
) -> None:
    made = {
        "at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
        "amount": Decimal("10.50"),
        "receipt": b"\x00\x01",
        "pair": ("a", 1),
        "tags": {"x"},
        "usage": {"total_tokens": 7},
    }
    stop_after = {"on": True}

    @kx.effect
    def book(to: str, *, idempotency_key: str | None = None) -> Any:
        post_json(delivery_server.url + "/book", {"to": to}, idempotency_key=idempotency_key)
        return dict(made)

    @kx.effect
    def when() -> dt.datetime:
        return dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc)

    @kx.agent(name=name("results"))
    def agent(run: kx.Run) -> Any:
        with run.step("s"):
            got = book("ann")
            at = when()
            if stop_after["on"]:
                kx.stop(run.id)
                run.checkpoint()
            return got, at

    run_id = name("results")
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    stop_after["on"] = False
    resumed = kx.resume(run_id)
    assert resumed.wait(WAIT) == "completed"
    got, at = resumed.result
    assert got == made and {k: type(v) for k, v in got.items()} == {
        k: type(v) for k, v in made.items()
    }
    assert at == dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc)
    assert delivery_server.count() == 1
    tokens = kx.sql(
        "SELECT result->>'$.usage.total_tokens' AS t FROM effects WHERE run_id = ? AND tool = ?",
        [run_id, "book"],
    )
    assert str(tokens["t"][0]) == "7"  # plain JSON stays queryable


# -- calls bound by parameter name, defaults applied (scheme 2) -----------------------------
def test_a_default_is_bound_and_shown_so_a_changed_default_needs_a_new_approval(
    store: Store, delivery_server: DeliveryServer
) -> None:
    tools: dict[str, Any] = {}

    def define(default: int) -> None:
        @kx.effect(needs_approval=True, name="pay")
        def pay(to: str, amount: int = default, *, idempotency_key: str | None = None) -> Any:
            body = {"to": to, "amount": amount}
            return post_json(delivery_server.url + "/pay", body, idempotency_key=idempotency_key)

        tools["pay"] = pay

    define(10)

    @kx.agent(name=name("defaults"))
    def agent(run: kx.Run) -> None:
        with run.step("bob"):
            tools["pay"]("bob")

    run_id = name("defaults")
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    [first] = kx.approvals(run_id)
    assert first.arguments == {"to": "bob", "amount": 10}, "the default is shown"
    first.approve(resume=False)
    define(1000000)  # the code changed its default before the resume
    assert kx.resume(run_id).wait(WAIT) == "suspended"
    assert delivery_server.count() == 0, "the old approval let another amount through"
    [second] = kx.approvals(run_id)
    assert second.arguments == {"to": "bob", "amount": 1000000}


def test_positional_keyword_and_default_spellings_are_one_call(
    store: Store, delivery_server: DeliveryServer
) -> None:
    style = {"v": 0}

    @kx.effect(needs_approval=True)
    def pay(to: str, amount: int = 10, *, idempotency_key: str | None = None) -> Any:
        body = {"to": to, "amount": amount}
        return post_json(delivery_server.url + "/pay", body, idempotency_key=idempotency_key).body

    @kx.agent(name=name("spellings"))
    def agent(run: kx.Run) -> None:
        with run.step("bob"):
            calls = [lambda: pay("bob", 10), lambda: pay("bob", amount=10), lambda: pay("bob")]
            calls[style["v"]]()

    run_id = name("spellings")
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    [first] = kx.approvals(run_id)
    first.approve(resume=False)
    style["v"] = 1
    assert kx.resume(run_id).wait(WAIT) == "completed"
    assert delivery_server.count() == 1
    spelled = [pay._bound(("bob", 10), {}), pay._bound(("bob",), {"amount": 10})]
    assert spelled == [pay._bound(("bob",), {})] * 2 == [{"to": "bob", "amount": 10}] * 2


def test_a_needs_approval_rule_that_changes_the_arguments_is_refused(
    store: Store, delivery_server: DeliveryServer
) -> None:
    def rule(to: str, order: dict[str, Any]) -> bool:
        order["amount"] = 1000000  # what the approver would not have seen
        return True

    @kx.effect(needs_approval=rule)
    def pay(to: str, order: dict[str, Any]) -> Any:
        return post_json(delivery_server.url + "/pay", {"to": to, "order": order}).body

    @kx.agent(name=name("mutating-rule"))
    def agent(run: kx.Run) -> None:
        with run.step("bob"):
            pay("bob", {"amount": 10})

    handle = agent.start(run_id=name("mutating-rule"))
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, kx.EffectArgumentsMismatch), handle.error
    assert "needs_approval rule changed" in str(handle.error)
    assert kx.approvals(handle.run_id) == [] and delivery_server.count() == 0


def test_a_gated_call_of_a_scheme_1_run_refuses_an_argument_it_cannot_bind(
    store: Store, delivery_server: DeliveryServer
) -> None:
    class Opaque:
        def __init__(self, amount: int) -> None:
            self.amount = amount

    @kx.effect(needs_approval=True)
    def pay(to: str, order: Any) -> Any:
        return post_json(delivery_server.url + "/pay", {"to": to}).body

    gate = {"on": True}

    @kx.agent(name=name("legacy-gated"))
    def agent(run: kx.Run) -> None:
        with run.step("wait"):
            if gate["on"]:
                run.checkpoint()
                kx.stop(run.id)
                run.checkpoint()
        with run.step("bob"):
            pay("bob", Opaque(10))

    run_id = name("legacy-gated")
    assert agent.start(run_id=run_id).wait(WAIT) in ("suspended", "stopped")
    store.write(lambda tx: tx.execute("UPDATE runs SET key_scheme = NULL WHERE id = ?", (run_id,)))
    gate["on"] = False
    handle = kx.resume(run_id)
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, UnencodableArgument), handle.error
    assert kx.approvals(run_id) == [] and delivery_server.count() == 0


# -- deciding by effect key: only while the key has had one request -----------------------
def test_approving_by_effect_key_is_refused_once_the_key_has_had_several_requests(
    store: Store, delivery_server: DeliveryServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelext._core.people import approvals as human

    plan = {"amount": 10}
    run_id = name("by-key")
    agent = payer(delivery_server, plan)
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    [seen] = kx.approvals(run_id)  # R1: pay("bob", 10), and its effect key
    plan["amount"] = 1000000
    assert kx.resume(run_id).wait(WAIT) == "suspended"  # R2 supersedes R1 under that key
    [newer] = kx.approvals(run_id)
    assert newer.key == seen.key and newer.id != seen.id
    for ident in (str(seen.key), str(seen.key)[:13], seen.key):
        with pytest.raises(kx.LedgerError, match="2 approval requests") as refused:
            human.approve(ident, store=store, resume=False)
        assert str(seen.id) in str(refused.value) and str(newer.id) in str(refused.value)
    import argparse

    from kernelext._cli import approvals as cli_approvals
    from kernelext._cli.common import CommandUsageError

    def ns(**kw: Any) -> argparse.Namespace:
        return argparse.Namespace(**{"note": None, "json": False, "run": None, **kw})

    with pytest.raises(CommandUsageError, match="Decide by request id"):
        cli_approvals.approve_command(ns(key=str(seen.key)), store)
    assert kx.approvals(run_id)[0].decision is None, "nothing was decided by the key"
    capsys.readouterr()
    assert cli_approvals.approvals_command(ns(run=run_id), store) == 0  # a listing exits 0
    listing = capsys.readouterr().out
    assert "amount = 1000000" in listing and 'to = "bob"' in listing
    # By request id: decided, and the decision echoes the arguments that were approved.
    assert cli_approvals.approve_command(ns(key=str(newer.id)), store) == 0
    out = capsys.readouterr().out
    assert "approved, with arguments" in out and '"amount":1000000' in out.replace(" ", "")
    decided = human.Approval(store, store.approval_rows(key=newer.key)[-1])
    assert "approved" in repr(decided) and "1000000" in repr(decided)
    # Only what was approved by id may ever be delivered (a resume here may already run it).
    assert [d["body"]["amount"] for d in delivery_server.deliveries] in ([], ["1000000"])


def test_approving_by_effect_key_works_while_the_key_has_one_request(
    store: Store, delivery_server: DeliveryServer
) -> None:
    from kernelext._core.people import approvals as human

    run_id = name("by-key-one")
    assert payer(delivery_server, {"amount": 10}).start(run_id=run_id).wait(WAIT) == "suspended"
    [seen] = kx.approvals(run_id)
    item = human.approve(str(seen.key), store=store, resume=False)
    assert item.id == seen.id and item.decision == "approved"
    assert '"amount": 10' in repr(item) or '"amount":10' in repr(item)


# -- step keys from a default object repr (B5) ----------------------------------------------
class Invoice:
    def __init__(self, number: int) -> None:
        self.number = number


@pytest.mark.parametrize("key", [str, repr, lambda i: f"invoice {i!r}", lambda i: i, float])
def test_step_keys_from_an_object_address_or_not_text_are_refused_before_the_step(
    key: Any, store: Store, delivery_server: DeliveryServer
) -> None:
    @kx.effect
    def pay(number: int) -> Any:
        return post_json(delivery_server.url + "/pay", {"n": number}).body

    @kx.agent(name=name("addr-keys"))
    def agent(run: kx.Run) -> None:
        items = [Invoice(1), Invoice(2)] if key is not float else [1, 2]
        for invoice in run.steps(items, key=key):
            pay(getattr(invoice, "number", invoice))

    run_id = name("addr-keys")
    handle = agent.start(run_id=run_id)
    assert handle.wait(WAIT) == "failed"
    assert isinstance(handle.error, InvalidName), handle.error
    assert "key=lambda i: i.id" in str(handle.error)
    assert store.completed_steps(run_id) == [] and delivery_server.count() == 0


def test_step_keys_may_be_ints_and_texts_with_a_lone_at(store: Store) -> None:
    @kx.agent(name=name("int-keys"))
    def agent(run: kx.Run) -> None:
        for _ in run.steps([7, 8], key=lambda i: i):
            pass
        for _ in run.steps(["mail at 0x10 street"], key=str):
            pass

    handle = agent.start(run_id=name("int-keys"))
    assert handle.wait(WAIT) == "completed"
