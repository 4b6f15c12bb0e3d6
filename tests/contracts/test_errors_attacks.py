"""Hard cases of what a notebook and the terminal show for errors: nothing is swallowed,
post-mortem debugging reaches the frame that raised, a mistyped store is not hidden."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.kernels import KernelSession

import kernelext

PACKAGE_DIR = os.path.dirname(os.path.abspath(kernelext.__file__))
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_an_error_that_draws_itself_is_shown_not_swallowed() -> None:
    """A stopped ``%%agent`` cell's one-line error is shown once ``import kernelext``
    installed the handler (the shell ignores what a custom handler returns)."""
    with KernelSession() as kernel:
        kernel.run("import kernelext as kx\nfrom kernelext.errors import AgentCellStopped").ok()
        reply = kernel.run("raise AgentCellStopped('run r-1 is suspended', run_id='r-1')")
        assert reply.status == "error"
        assert reply.error is not None
        shown = ANSI.sub("", "\n".join(reply.error.get("traceback", [])))
        assert "run r-1 is suspended" in shown, reply.error


def test_post_mortem_reaches_the_frame_that_raised(tmp_path: Path) -> None:
    """The display leaves kernelext's frames out; %debug and %tb (sys.last_traceback)
    and the exception's own traceback keep every frame."""
    store = tmp_path / "s.duckdb"
    with KernelSession() as kernel:
        kernel.run(f"import kernelext as kx\nkx.configure(store={str(store)!r})").ok()
        reply = kernel.run("def mine():\n    kx.resume('nope')\nmine()")
        assert reply.error is not None
        shown = ANSI.sub("", "\n".join(reply.error["traceback"]))
        assert PACKAGE_DIR not in shown and "mine" in shown, shown
        probe = kernel.run(
            "import sys, traceback\n"
            "print(traceback.extract_tb(sys.last_traceback)[-1].filename)\n"
            "print(traceback.extract_tb(sys.last_value.__traceback__)[-1].filename)"
        ).ok()
        last, own = probe.stdout.split()
        assert last.startswith(PACKAGE_DIR + os.sep), probe.stdout
        assert own.startswith(PACKAGE_DIR + os.sep), probe.stdout


def test_pdb_on_opens_the_debugger_after_the_short_display(tmp_path: Path) -> None:
    """``%pdb on``: the debugger still opens (on the full traceback) after the display."""
    store = tmp_path / "s.duckdb"
    with KernelSession() as kernel:
        kernel.run(f"import kernelext as kx\nkx.configure(store={str(store)!r})").ok()
        kernel.run(  # the debugger reads sys.last_traceback; record where it would open
            "import sys, traceback\n"
            "_seen = []\n"
            "def _debugger(force=False):\n"
            "    _seen.append(traceback.extract_tb(sys.last_traceback)[-1].filename)\n"
            "get_ipython().debugger = _debugger\n"
            "%pdb on"
        ).ok()
        kernel.run("kx.resume('nope')")
        probe = kernel.run("%pdb off\nprint(_seen[-1] if _seen else 'no debugger')").ok()
        assert probe.stdout.splitlines()[-1].startswith(PACKAGE_DIR + os.sep), probe.stdout


@pytest.mark.xfail(
    strict=True,
    reason="a listing command on a mistyped --store path creates an empty store there "
    "(and its folders) and answers 'no runs' with exit 0; the CLI opens stores like the "
    "library, which creates them",
)
def test_a_listing_on_a_mistyped_store_path_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "store.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "kernelext", "runs", "--store", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not missing.parent.exists()
    assert done.returncode != 0 and str(missing) in done.stderr


LEDGER_QUERY = "select * from (values (1.0::double), (null), ('inf'::double)) t(x)"


def test_a_ledger_table_with_infinity_and_a_null_is_shown(tmp_path: Path) -> None:
    """A float column with NULL and inf is no 'whole numbers' column: the table shows."""
    store = tmp_path / "s.duckdb"
    with KernelSession() as kernel:
        kernel.run("%load_ext kernelext").ok()
        kernel.run(f"import kernelext as kx\nkx.configure(store={str(store)!r})").ok()
        reply = kernel.run(f"%%ledger\n{LEDGER_QUERY}").ok()
        assert reply.results, reply
        plain = str(reply.results[0].get("text/plain", ""))
        assert "inf" in plain and "OverflowError" not in plain + reply.stderr, reply
        assert "<table" in str(reply.results[0].get("text/html", "")), reply


def test_a_ledger_table_can_be_pickled(tmp_path: Path) -> None:
    """``%%ledger -o df`` then ``df.to_pickle(...)`` / pickle works, and reads back."""
    store = tmp_path / "s.duckdb"
    with KernelSession() as kernel:
        kernel.run("%load_ext kernelext").ok()
        kernel.run(f"import kernelext as kx\nkx.configure(store={str(store)!r})").ok()
        kernel.run(f"%%ledger -o df\n{LEDGER_QUERY}").ok()
        back = kernel.run(
            f"import pandas as pd\ndf.to_pickle({str(tmp_path / 'df.pkl')!r})\n"
            f"back = pd.read_pickle({str(tmp_path / 'df.pkl')!r})\n"
            "print(back.equals(df), type(back).__name__ == type(df).__name__)"
        ).ok()
        assert back.stdout.split() == ["True", "True"], back


@pytest.mark.xfail(
    strict=True,
    reason="a run id that is not valid UTF-8 (a terminal in another encoding) reaches "
    "the database and comes back as its conversion error, exit 1, not 'No run' with exit 2",
)
def test_a_run_id_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kernelext", "show", b"\xff", "--store", str(tmp_path / "s.duckdb")],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert b"No run" in done.stderr and b"Traceback" not in done.stderr
