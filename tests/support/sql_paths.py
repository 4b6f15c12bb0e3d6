"""The three doors of read-only SQL (``kx.sql``, ``%%ledger`` in an IPython shell, ``kernelext
sql`` in a subprocess), driven with the same queries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import kernelext as kx
from kernelext._core.process.runtime import runtime
from kernelext.errors import ReadOnlyError

__all__ = [
    "SECRET",
    "cli_sql",
    "cli_sql_each",
    "close_shell",
    "places",
    "refused_on_every_path",
    "run_in_shell",
    "shell_with_extension",
]

SECRET = "TOP-SECRET-4711"


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A folder outside the store with a secret file in it, and a working directory (a
    fixture, offered to tests/store by its conftest)."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "secret.txt").write_text(f"id\n{SECRET}\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return {"root": tmp_path, "out": out, "secret": out / "secret.txt", "cwd": cwd}


def refused_on_every_path(
    store: Any, store_path: Path, cwd: Path, queries: list[str]
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Each query refused by ``kx.sql`` on the open ``store`` (closed after), by a
    ``%%ledger`` cell and by ``kernelext sql`` (exit 2); the messages of each, by query."""
    by_api = {}
    for query in queries:
        with pytest.raises(ReadOnlyError) as refused:
            kx.sql(query, store=store)
        by_api[query] = str(refused.value)
    store.close()
    by_magic = run_in_shell(store_path, queries)
    by_cli = {}
    for query, answer in zip(queries, cli_sql_each(store_path, cwd, queries), strict=True):
        assert answer["returncode"] == 2, (query, answer)
        by_cli[query] = str(answer["stderr"]).strip().removeprefix("kernelext: ")
    return by_api, by_magic, by_cli


def run_in_shell(store_path: Path, queries: list[str]) -> dict[str, str]:
    """Each query as a %%ledger cell; the UsageError each one raised, by query."""
    shell = shell_with_extension(store_path)
    try:
        messages = {}
        for query in queries:
            # IPython itself refuses a cell magic with an empty body: "" goes as %ledger
            result = shell.run_cell("%%ledger\n" + query if query else "%ledger")
            error = result.error_in_exec
            assert isinstance(error, UsageError), (query, result.result)
            messages[query] = str(error)
        line = shell.run_cell("%ledger " + queries[0].replace("\n", " "))
        assert isinstance(line.error_in_exec, UsageError)
        return messages
    finally:
        close_shell(shell)


def shell_with_extension(store_path: Path) -> InteractiveShell:
    shell = InteractiveShell.instance()
    shell.config.pop("Kernelext", None)
    runtime().settings.use_store(str(store_path))
    shell.run_line_magic("load_ext", "kernelext")
    return shell


def close_shell(shell: InteractiveShell) -> None:
    shell.run_line_magic("unload_ext", "kernelext")
    shell.config.pop("Kernelext", None)
    for name in ("run_id", "evil", "out", "path"):
        shell.user_ns.pop(name, None)
    runtime().settings.close()
    runtime().settings.use_store(None)


def cli_sql_each(store_path: Path, cwd: Path, queries: list[str]) -> list[dict[str, Any]]:
    """``kernelext sql --store STORE -- QUERY`` for each query, in one subprocess that runs
    the command line's ``main`` for each (support/cli_each.py): each one's exit code,
    stdout and stderr."""
    commands = [["sql", "--store", str(store_path), "--", query] for query in queries]
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("cli_each.py"))],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "KERNELEXT_STORE": str(store_path)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    answers: list[dict[str, Any]] = json.loads(proc.stdout)
    return answers


def cli_sql(store_path: Path, cwd: Path, query: str, *options: str) -> Any:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelext",
            "sql",
            "--store",
            str(store_path),
            *options,
            "--",
            query,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "KERNELEXT_STORE": str(store_path)},
    )
