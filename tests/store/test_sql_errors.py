"""What the database refuses in a ``kx.sql`` query reaches the user as a kernelext error:
``QueryError`` (the database's message, what to do, its own exception as ``__cause__``) and
``QueryTimeout`` (still a ``TimeoutError``), both caught by ``except kx.KernelextError``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import kernelext as kx
from kernelext._store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(str(tmp_path / "errors.duckdb"))
    yield opened
    opened.close()


@pytest.mark.parametrize(
    ("query", "cause", "said"),
    [
        ("SELECT * FROM nosuchtable", duckdb.CatalogException, "nosuchtable"),
        ("SELEC 1", duckdb.ParserException, "syntax error"),
        ("SELECT nope FROM runs", duckdb.BinderException, "nope"),
        ("SELECT CAST('x' AS INTEGER)", duckdb.ConversionException, "'x'"),
    ],
)
def test_a_query_the_database_refuses_is_a_query_error(
    store: Store, query: str, cause: type[Exception], said: str
) -> None:
    with pytest.raises(kx.KernelextError) as raised:
        kx.sql(query, store=store)
    error = raised.value
    assert type(error) is kx.QueryError and isinstance(error, ValueError)
    assert isinstance(error.__cause__, cause)
    assert str(error).startswith("The query was not run: the database says: ")
    assert said in str(error) and "SHOW TABLES" in str(error)
    assert kx.sql("SELECT count(*) AS n FROM runs", store=store)["n"].tolist() == [0]


def test_a_query_past_its_timeout_is_a_query_timeout(store: Store) -> None:
    endless = "SELECT count(*) FROM range(1000000000000000) t(i), range(10) u(j) WHERE i + j < 0"
    with pytest.raises(kx.KernelextError) as raised:
        kx.sql(endless, timeout=0.2, store=store)
    assert type(raised.value) is kx.QueryTimeout and isinstance(raised.value, TimeoutError)
    assert "timeout=0.2s" in str(raised.value) and "larger timeout" in str(raised.value)


def test_query_text_that_is_not_valid_unicode_is_a_query_error(store: Store) -> None:
    with pytest.raises(kx.QueryError, match="not valid Unicode at position 8"):
        kx.sql("select '\udc80' as x", store=store)


def test_a_result_pandas_cannot_hold_is_a_query_error_that_says_to_cast(store: Store) -> None:
    pytest.importorskip("pandas")
    with pytest.raises(kx.QueryError, match="cannot become a pandas DataFrame") as raised:
        kx.sql("select union_value(k := 1) as u", store=store)
    assert "::VARCHAR" in str(raised.value)
    assert kx.sql("select union_value(k := 1)::VARCHAR as u", store=store) is not None
