"""Runs made of ``%%agent`` cells revalidate on resume like any other run: credentials
are refreshed and recorded facts re-checked before the next cell executes.

A real in-process IPython shell runs the cells against a real DuckDB store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import kernelext as kx
from kernelext._core.lifecycle.cell_runs import forget_cell_runs
from kernelext._core.process.runtime import runtime

SETUP = """
import kernelext as kx
PRICES = {"A": 10.0}
TOKENS = ["tok-1"]
REFRESHED = []
SENT = []

def price_of(sku):
    return PRICES[sku]

def new_token():
    REFRESHED.append(TOKENS[-1])
    return TOKENS[-1]

@kx.effect
def order(sku, price):
    SENT.append((sku, price))
    return {"ordered": sku}

kx.checks.register("price_of", price_of)
kx.credentials.register("api", refresh=new_token)
"""

FIRST = """%%agent shop --step quote
token = run.fact("api", TOKENS[-1], kind="credential")
price = run.fact("price:A", price_of("A"), check=price_of, args=("A",))
"""

SECOND = """%%agent shop --step buy
order("A", price)
"""


@pytest.fixture
def ip(store_path: Path) -> Iterator[InteractiveShell]:
    shell = InteractiveShell.instance()
    runtime().settings.use_store(str(store_path))
    shell.run_line_magic("load_ext", "kernelext")
    assert shell.run_cell(SETUP).success
    yield shell
    shell.run_line_magic("unload_ext", "kernelext")
    for name in ("PRICES", "TOKENS", "REFRESHED", "SENT", "price_of", "new_token", "order"):
        shell.user_ns.pop(name, None)
    kx.credentials.unregister("api")
    kx.checks.unregister("price_of")
    forget_cell_runs()
    runtime().settings.close()


def stopped_after_first_cell(ip: InteractiveShell) -> None:
    assert ip.run_cell(FIRST).success
    ip.run_line_magic("agent", "stop shop")
    assert kx.runs().set_index("id").loc["shop", "status"] == "suspended"


def test_a_changed_fact_holds_the_next_cell_until_someone_decides(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped_after_first_cell(ip)
    ip.user_ns["PRICES"]["A"] = 12.5  # the world moved on while the run was suspended
    capsys.readouterr()
    ip.run_line_magic("agent", "resume shop")
    said = capsys.readouterr().out
    assert "needs a decision" in said and "price:A" in said
    assert ip.run_cell(SECOND).error_in_exec is not None  # held back, no effect sent
    shown = capsys.readouterr()
    assert "kx.revalidation('shop')" in shown.out + shown.err
    assert ip.user_ns["SENT"] == []

    review = kx.revalidation("shop")
    [fact] = review.contradictions
    assert (fact.name, fact.recorded, fact.current) == ("price:A", 10.0, 12.5)
    review.accept("the new price is fine")
    assert ip.run_cell(SECOND).success
    assert ip.user_ns["SENT"] == [("A", 10.0)]  # the cell's state is the snapshot's


def test_credentials_are_refreshed_before_the_next_cell(ip: InteractiveShell) -> None:
    stopped_after_first_cell(ip)
    ip.user_ns["TOKENS"].append("tok-2")
    ip.run_line_magic("agent", "resume shop")
    assert ip.user_ns["REFRESHED"] == ["tok-2"]  # refreshed at resume, before any cell ran
    assert ip.run_cell(SECOND + "fresh = run.credential('api')\n").success
    assert ip.user_ns["fresh"] == "tok-2"
    assert ip.user_ns["SENT"] == [("A", 10.0)]


def test_a_failing_refresh_leaves_the_cell_run_suspended_with_a_deadline(
    ip: InteractiveShell,
) -> None:
    stopped_after_first_cell(ip)
    ip.user_ns["TOKENS"].append(None)  # the token endpoint gives nothing back
    result = ip.run_cell("%agent resume shop")
    assert isinstance(result.error_in_exec, UsageError)  # one line, no traceback
    assert "'api'" in str(result.error_in_exec)
    row = runtime().settings.store().get_run("shop")
    assert row["status"] == "suspended" and row["reason"] == "error"
    assert row["deadline"] is not None
    assert ip.user_ns["SENT"] == []
