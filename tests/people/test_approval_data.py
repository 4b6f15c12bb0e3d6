"""Data arguments are approved seeing every value: a DataFrame, an Arrow table or a numpy
array in a gated call is stored whole with its approval request and shown on every surface
(the card's paged view, ``kernelext approvals --show``/``--out``/``--json``, ``.data``),
with its changes since the previously approved call of the tool; data too large to show is
approved only as unseen data, recorded. Real runs on a real DuckDB store; the payments go to
the real local HTTP server, which counts every delivery.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.http_server import DeliveryServer, post_json
from support.live import name

import kernelext as kx
from kernelext._cli.main import main as cli
from kernelext._store import Store
from kernelext.errors import LedgerError

WAIT = 60.0
PLANTED = 637  # the row, deep inside, that nobody would see in a cut repr


def payees(rows: int = 1000, planted: bool = True) -> pd.DataFrame:
    names = [f"user{i:04d}" for i in range(rows)]
    amounts = [10] * rows
    if planted:
        names[PLANTED], amounts[PLANTED] = "mallory", 250000
    return pd.DataFrame({"name": names, "amount": amounts})


def payer(server: DeliveryServer, batches: dict[str, Any]) -> kx.Agent:
    """Pays ``batches["rows"]`` (read at call time) in one gated call."""

    @kx.effect(needs_approval=True)
    def pay_all(rows: Any, *, idempotency_key: str | None = None) -> Any:
        if isinstance(rows, np.ndarray):
            body: Any = rows.tolist()
        elif isinstance(rows, pa.Table):
            body = rows.to_pylist()
        else:
            body = rows.to_dict("records")
        return post_json(server.url + "/pay", {"rows": body}, idempotency_key=idempotency_key).body

    @kx.agent(name=name("batch-payer"))
    def agent(run: kx.Run) -> None:
        with run.step("pay"):
            pay_all(batches["rows"])

    return agent


def waiting(server: DeliveryServer, rows: Any, run_id: str) -> kx.Approval:
    assert payer(server, {"rows": rows}).start(run_id=run_id).wait(WAIT) == "suspended"
    [request] = kx.approvals(run_id)
    return request


def command(store: Store, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli([*argv, "--store", store.location])
    out = capsys.readouterr()
    return code, out.out + out.err


def pages_text(view: Any) -> str:
    """Every page of a card's data view, stepped through with its Next button."""
    seen = [view.table.value]
    while not view.next_button.disabled:
        view.next_button.click()
        seen.append(view.table.value)
    return "".join(seen)


def test_every_row_of_a_dataframe_is_shown_on_every_surface_before_it_passes(
    store: Store,
    delivery_server: DeliveryServer,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    from kernelext.widgets._approvals import ApprovalCard

    run_id = name("frame")
    request = waiting(delivery_server, payees(), run_id)
    # the accessor: every row, the planted one too
    data = request.data["rows"]
    assert data.columns == ["name", "amount"] and data.row_count == 1000
    assert data.rows is not None and data.rows[PLANTED] == ["mallory", 250000]
    assert "1,000 rows × 2 columns (name, amount)" in data.summary()
    # the listing: rows and columns; --json: the stored arguments with every row
    code, listing = command(store, capsys, "approvals")
    assert code == 0 and "rows = pandas.DataFrame: 1,000 rows × 2 columns (name, amount)" in listing
    code, as_json = command(store, capsys, "approvals", "--json")
    [row] = json.loads(as_json)["approvals"]
    assert json.loads(row["args"])["rows"]["rows"][PLANTED] == ["mallory", 250000]
    # --show prints every row; --out writes them
    out = tmp_path / "rows.csv"
    code, shown = command(store, capsys, "approvals", "--show", str(request.id), "--out", str(out))
    assert code == 0
    planted = [str(PLANTED + 1), "mallory", "250000"]
    assert any(line.split() == planted for line in shown.splitlines())
    assert sum(1 for line in shown.splitlines() if "user" in line) == 999
    written = out.read_text().splitlines()
    assert len(written) == 1001 and written[PLANTED + 1] == "mallory,250000"
    # the card: its paged view reaches every row
    card = ApprovalCard(request)
    assert card.data is not None
    [view] = card.data.children
    every = pages_text(view)
    assert "<td>mallory</td><td>250000</td>" in every and every.count("<tr>") == 1000 + 5
    assert "1,000 rows × 2 columns" in card.args.value
    # approved as seen: exactly these rows pass, once
    assert request.approve().wait(WAIT) == "completed"
    [delivery] = delivery_server.deliveries
    assert len(delivery["body"]["rows"]) == 1000
    assert delivery["body"]["rows"][PLANTED] == {"name": "mallory", "amount": 250000}


def test_numpy_and_arrow_values_are_shown_not_only_their_hash(
    store: Store, delivery_server: DeliveryServer, capsys: pytest.CaptureFixture[str]
) -> None:
    amounts = np.full(500, 10, dtype=np.int64)
    amounts[321] = 250000
    request = waiting(delivery_server, amounts, name("array"))
    assert request.arguments["rows"]["v"][321] == 250000
    data = request.data["rows"]
    assert "shape 500 (500 values)" in data.summary()
    code, shown = command(store, capsys, "approvals", "--show", str(request.id))
    assert code == 0 and any(line.split() == ["322", "250000"] for line in shown.splitlines())
    table = pa.table({"name": ["ann", "mallory"], "amount": [10, 250000]})
    request = waiting(delivery_server, table, name("arrow"))
    assert request.data["rows"].rows == [["ann", 10], ["mallory", 250000]]


def test_data_too_large_to_show_is_approved_only_as_unseen_and_recorded(
    store: Store, delivery_server: DeliveryServer, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = name("unseen")
    big = payees(rows=50_001)  # 100,002 cells: over the limit
    request = waiting(delivery_server, big, run_id)
    data = request.data["rows"]
    assert data.unseen and data.row_count == 50_001
    with pytest.raises(LedgerError, match=r"approving unseen data of 50,001 rows"):
        request.approve()
    code, said = command(store, capsys, "approve", str(request.id))
    assert code == 2 and "--unseen-data" in said and "nobody has seen them" in said
    assert [r.decision for r in kx.approvals(run_id)] == [None]  # nothing decided
    code, said = command(store, capsys, "approve", str(request.id), "--unseen-data")
    assert code == 0, said
    [decided] = [e for e in store.events(run_id) if e["kind"] == "approval_decided"]
    assert json.loads(decided["detail"])["unseen_data"] == {"rows": 50_001}
    assert kx.resume(run_id).wait(WAIT) == "completed"
    assert delivery_server.count() == 1


def test_the_changes_since_the_previously_approved_call_are_shown(
    store: Store, delivery_server: DeliveryServer, capsys: pytest.CaptureFixture[str]
) -> None:
    first = waiting(delivery_server, payees(planted=False), name("before"))
    assert first.approve().wait(WAIT) == "completed"
    changed = payees(planted=False)
    changed.loc[500, "amount"] = 250000
    request = waiting(delivery_server, changed, name("after"))
    assert request.previous is not None and request.previous.id == first.id
    [diff] = request.changes
    assert (diff.added, diff.removed) == ([], [])
    assert diff.changed == [(["user0500", "10"], ["user0500", "250000"])]
    code, shown = command(store, capsys, "approvals", "--show", str(request.id))
    assert code == 0
    assert f"since the approved request {first.id}" in shown
    assert "rows: 1 changed, 0 added, 0 removed: (user0500, 10) -> (user0500, 250000)" in shown


# -- approve with edits ----------------------------------------------------------------------
def single_payer(server: DeliveryServer) -> kx.Agent:
    @kx.effect(needs_approval=True)
    def pay(to: str, amount: int, *, idempotency_key: str | None = None) -> Any:
        body = {"to": to, "amount": amount}
        return post_json(server.url + "/pay", body, idempotency_key=idempotency_key).body

    @kx.agent(name=name("edit-payer"))
    def agent(run: kx.Run, to: str, amount: int) -> Any:
        with run.step("pay"):  # the second call waits: the step runs again, the first replays
            return [pay(to, amount)["delivery"], pay("carol", 50)["delivery"]]

    return agent


@pytest.mark.parametrize("where", ["api", "cli"])
def test_a_call_approved_with_edits_is_made_once_with_them_and_both_are_kept(
    where: str,
    store: Store,
    delivery_server: DeliveryServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_id = name("edit-" + where)
    agent = single_payer(delivery_server)
    assert agent.start("bob", 500, run_id=run_id).wait(WAIT) == "suspended"
    [request] = kx.approvals(run_id)
    with pytest.raises(LedgerError, match=r"no argument 'amonut' to edit"):
        request.approve(edit={"amonut": 100})
    if where == "api":
        handle = request.approve(note="capped", edit={"amount": 100})
    else:
        code, said = command(
            store, capsys, "approve", str(request.id), "--edit", "amount=100", "--note", "capped"
        )
        assert code == 0 and 'edited arguments {"to": "bob", "amount": 100}' in said, said
        handle = kx.resume(run_id)
    assert handle.wait(WAIT) == "suspended"  # carol's call waits
    [carol] = kx.approvals(run_id)
    assert carol.approve().wait(WAIT) == "completed"  # bob's edited call replayed, not made
    assert [d["body"] for d in delivery_server.deliveries] == [
        {"to": "bob", "amount": 100},
        {"to": "carol", "amount": 50},
    ]
    # the ledger: the call made; the request: the original and the edited call, bound
    effect = store.effect(request.key)
    assert effect is not None and json.loads(effect["args"]) == {"to": "bob", "amount": 100}
    row, _carol = store.approval_rows(run_id=run_id)
    assert json.loads(row["args"]) == {"to": "bob", "amount": 500}
    assert json.loads(row["edited_args"]) == {"to": "bob", "amount": 100}
    assert row["edited_args_hash"] == effect["args_hash"] != row["args_hash"]
    decided, _ = [e for e in store.events(run_id) if e["kind"] == "approval_decided"]
    assert json.loads(decided["detail"])["edit"] == {"amount": {"from": 500, "to": 100}}
    # a restart from the step replays the edited call it carries: nothing is sent again
    again = kx.restart(run_id, from_step=0, new_run_id=run_id + "-again")
    assert again.wait(WAIT) == "completed"
    assert delivery_server.count() == 2


# -- the model: every row stored, and the changes found, for generated tables ----------------
numbers = st.one_of(st.integers(-(2**40), 2**40), st.none())
texts = st.one_of(st.text(max_size=6), st.none())
floats = st.one_of(st.floats(allow_nan=False), st.none())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(numbers, texts, floats), max_size=40))
def test_every_row_of_a_generated_table_is_stored_as_it_is(rows: list[tuple[Any, ...]]) -> None:
    from kernelext._core.encoding.data_args import data_arguments
    from kernelext._core.encoding.keys import display_args
    from kernelext._core.encoding.tagged import untag

    columns = {"n": pa.int64(), "t": pa.string(), "x": pa.float64()}
    table = pa.table(
        {
            name: pa.array([r[i] for r in rows], kind)
            for i, (name, kind) in enumerate(columns.items())
        }
    )
    stored = data_arguments(json.loads(display_args({"rows": table}, full=True)))["rows"]
    assert untag(stored.rows) == [list(r.values()) for r in table.to_pylist()]  # inf: tagged
    assert stored.row_count == table.num_rows


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 10**6), max_size=30),
    st.sets(st.integers(0, 29)),
    st.sets(st.integers(0, 29)),
    st.integers(0, 5),
)
def test_the_changes_found_are_the_changes_made(
    amounts: list[int], dropped: set[int], changed: set[int], added: int
) -> None:
    from kernelext._core.encoding.data_args import data_arguments, data_diff
    from kernelext._core.encoding.keys import display_args

    before = pd.DataFrame({"id": [f"p{i}" for i in range(len(amounts))], "amount": amounts})
    after = before.copy()
    changed = {i for i in changed if i < len(amounts)} - dropped
    for i in changed:
        after.loc[i, "amount"] = amounts[i] + 1
    after = after.drop(index=[i for i in dropped if i < len(amounts)])
    extra = pd.DataFrame({"id": [f"new{i}" for i in range(added)], "amount": [1] * added})
    after = pd.concat([after, extra], ignore_index=True) if added else after

    def stored(frame: pd.DataFrame) -> Any:
        return data_arguments(json.loads(display_args({"rows": frame}, full=True)))["rows"]

    diff = data_diff(stored(before), stored(after))
    assert sorted(old[0] for old, _new in diff.changed) == sorted(f"p{i}" for i in changed)
    assert sorted(row[0] for row in diff.removed) == sorted(
        f"p{i}" for i in dropped if i < len(amounts)
    )
    assert sorted(row[0] for row in diff.added) == [f"new{i}" for i in range(added)]


def test_an_edit_of_a_variable_argument_is_never_made(
    store: Store, delivery_server: DeliveryServer
) -> None:
    """``**extra`` holds arguments that are not the tool's own names: an edit of it could
    stand for another argument or the ledger's key. Approved with such an edit, the call is
    not made (nothing reaches the server) and the run says why."""
    url = delivery_server.url

    @kx.effect(name=name("pay_extra"), needs_approval=True)
    def pay(to: str, amount: int, **extra: Any) -> int:
        body = json.dumps({"to": to, "amount": amount, **extra}).encode()
        request = urllib.request.Request(f"{url}/pay", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)

    @kx.agent(name=name("extra-payer"))
    def agent(run: kx.Run) -> None:
        with run.step("pay"):
            pay("bob", 500, memo="rent")

    run_id = name("edit-extra")
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    [request] = kx.approvals(run_id)
    handle = request.approve(edit={"extra": {"idempotency_key": "attacker-key"}})
    assert handle.wait(WAIT) == "failed"
    assert "variable argument" in str(handle.error)
    assert delivery_server.count() == 0


def test_a_long_plain_argument_is_listed_whole(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A list of 3,001 amounts whose last one is large: ``kernelext approvals`` shows it (no
    cut that hides what the approval lets through)."""

    @kx.effect(name=name("pay_many"), needs_approval=True)
    def pay_many(amounts: list[int]) -> int:
        return len(amounts)

    @kx.agent(name=name("many-payer"))
    def agent(run: kx.Run) -> None:
        with run.step("pay"):
            pay_many([1] * 3000 + [999999999])

    run_id = name("long-list")
    assert agent.start(run_id=run_id).wait(WAIT) == "suspended"
    code, listed = command(store, capsys, "approvals", "--run", run_id)
    assert code == 0 and "999999999" in listed, listed[-300:]


def test_an_index_other_than_the_default_is_shown_as_a_column() -> None:
    """``RangeIndex(1000, 1002)`` reaches the tool: the approver sees it, not rows that read
    as if the index were 0, 1."""
    import pandas as pd

    from kernelext._core.encoding.data_args import table_parts

    shifted = pd.DataFrame({"amount": [10, 20]}, index=pd.RangeIndex(1000, 1002))
    parts = table_parts(shifted)
    assert parts is not None
    columns, rows, count = parts
    assert count == 2 and columns[0] == "amount" and len(columns) == 2
    assert rows == [[10, 1000], [20, 1001]]
    plain = table_parts(pd.DataFrame({"amount": [10, 20]}))
    assert plain is not None and plain[0] == ["amount"] and plain[1] == [[10], [20]]
