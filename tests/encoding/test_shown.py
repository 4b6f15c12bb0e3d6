"""The display door (kernelext/_shown.py): every text a person reads shows what is stored.

Stored names and arguments may hold characters that draw something else: a bidi override
(U+202E) turns "1987 6543" into "3456 7891" on screen, a zero-width space hides inside
``bob\\u200b@bank.com``, a Cyrillic "а" makes ``pаypal.com`` read as the real domain.
Generated texts (hypothesis, over the Unicode categories that do this) are stored through
the real API in a real DuckDB file, then read back through every surface: the real
command line (``kernelext.__main__``'s ``main``), ``kx.approvals()`` text and repr, the
Handle, ``kx.runs()``, the saved copy of the panel. None may print such a character
raw. Catalogue tests fail when a command, a ``repr``/``text()`` or a widget escape
bypasses the door.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import threading
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelext as kx
from kernelext._cli.main import build_parser, main
from kernelext._core.process.runtime import runtime
from kernelext._shown import shown, shown_html

REPO = Path(__file__).resolve().parents[2]
BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
LOOK_ALIKES = ("p\u0430ypal.com", "\uff50aypal", "b\u043eb@bank.com")  # Cyrillic а, о; fullwidth
MIXED = "[mixed scripts: Latin + Cyrillic]"


# Invisible though not a control or a space: Hangul fillers (Lo), the Braille blank (So),
# variation selectors, the combining grapheme joiner, Mongolian and Khmer ones (Mn).
BLANK_LOOKING = "\u3164\u115f\u1160\uffa0\u2800\ufe0f\U000e0100\u034f\u180b\u17b4\u17b5"


def unsafe(text: str) -> list[str]:
    """The characters of ``text`` a person could not see as they are: control, format
    (zero-width, bidi), separators other than the space and the newline, private-use or
    unassigned ones, blank-looking ones, and a combining mark with nothing to combine with."""
    found = []
    before = "\n"
    for char in text:
        category = unicodedata.category(char)
        invisible = category[0] == "C" or category in ("Zl", "Zp", "Zs") or char in BLANK_LOOKING
        if (invisible and char not in " \n") or (category[0] == "M" and before in " \n"):
            found.append(char)
        before = char
    return found


# -- the door itself -----------------------------------------------------------------------------
hostile_char = st.one_of(
    st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Zs", "Co", "Cn", "Mn", "Me", "Mc"]),
    st.sampled_from(BIDI_CONTROLS),
    st.sampled_from(BLANK_LOOKING),
)
hostile_text = st.lists(
    st.one_of(
        hostile_char, st.sampled_from([*LOOK_ALIKES, "1987 6543", "a", "a\ufe0f", " ", "\n"])
    ),
    min_size=1,
    max_size=10,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(hostile_text, st.booleans())
def test_the_door_leaves_nothing_invisible_and_is_idempotent(text: str, lines: bool) -> None:
    once = shown(text, lines=lines)
    assert unsafe(once) == []
    assert shown(once, lines=lines) == once
    if not lines:
        assert "\n" not in once


@pytest.mark.parametrize(
    ("raw", "seen"),
    [
        ("\u20261987 \u202e6543", "\u20261987 \\u202e6543"),
        ("bob\u200b@bank.com", "bob\\u200b@bank.com"),
        ("p\u0430ypal.com", f"p\u0430ypal.com {MIXED} [look-alike characters]"),
        ("\uff50aypal.com", "\uff50aypal.com [look-alike characters]"),
        ("\u05e9\u05dc\u05d5\u05dd 1987", "\u05e9\u05dc\u05d5\u05dd 1987 [right-to-left text]"),
        ("ok\x1b[31m red", "ok\\x1b[31m red"),
        ("a\xa0b", "a\\xa0b"),
        ("\u0301x", "\\u0301x"),
        ("\U0001d429aypal", "\U0001d429aypal [look-alike characters]"),
        ("caf\u00e9, cafe\u0301, \u6771\u4eactokyo, \u043c\u043e\u0441\u043a\u0432\u0430", None),
        ("\u30e9\u30fc\u30e1\u30f3, don\u02bct, 1\u00aa, 5 m\u00b2", None),
        ("\u0928\u092e\u0938\u094d\u0924\u0947", None),
    ],
)  # fmt: skip
def test_the_door_shows_each_trick_and_leaves_plain_text_alone(raw: str, seen: str | None) -> None:
    assert shown(raw) == (raw if seen is None else seen)
    assert "&lt;b&gt;" in shown_html("<b>\u202e")


# -- every surface, on a real store --------------------------------------------------------------
@kx.effect(needs_approval=True)
def pay(to: str, account: str, amount: int) -> int:
    return amount


@kx.agent(name="payer\u200b\u202e")
def payer(run: kx.Run, key: str, to: str, account: str) -> None:
    for _ in run.steps([key], key=str):
        pay(to, account, 142420)


@contextlib.contextmanager
def a_store(where: Path) -> Iterator[str]:
    path = str(Path(tempfile.mkdtemp(dir=where)) / "kernelext.duckdb")
    kx.open_store(path)
    try:
        yield path
    finally:  # a run's helper threads may still renew its lease: let them end first
        for thread in threading.enumerate():
            if thread.name.startswith(("kernelext-monitor[", "kernelext-stop-watch[")):
                thread.join(30)
        runtime().close()


def cli(*args: str, store: str) -> str:
    """A read of the command line, in this process (its ``main``)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main([*args, "--store", store])
    return out.getvalue() + err.getvalue()


def cli_process(*args: str, store: str) -> str:
    """A command in a process of its own, as from a terminal: a decision made there does
    not run the agent (this process would, as the run's owner)."""
    done = subprocess.run(
        [sys.executable, "-m", "kernelext", *args, "--store", store],
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )
    return (done.stdout + done.stderr).decode("utf-8", errors="surrogateescape")


def python_surfaces(handle: kx.Handle) -> dict[str, str]:
    from kernelext.widgets._render import view_of
    from kernelext.widgets._static import saved_html

    waiting = kx.approvals()
    return {
        "kx.approvals().text()": waiting.text(),
        "repr(kx.approvals())": repr(waiting),
        "repr(approval)": repr(next(iter(waiting))),
        "repr(handle)": repr(handle),
        "handle.text_summary()": handle.text_summary(),
        "handle.status_text": handle.status_text,
        "repr(kx.runs())": repr(kx.runs()),
        "kx.runs() HTML": kx.runs()._repr_html_(),
        "saved copy of the panel": saved_html(view_of(handle)),
    }


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile_text)
def test_no_surface_prints_a_hostile_character_raw(tmp_path: Path, text: str) -> None:
    text = text.replace("\0", "\x01")  # a name may not hold NUL (both stores refuse it)
    run_id = f"r-{text}-{len(list(tmp_path.iterdir()))}"
    to, account = f"bob{text}@bank.com p\u0430ypal.com", f"\u20261987 \u202e6543{text}"
    with a_store(tmp_path) as store:
        handle = payer.run(f"k{text}", to, account, run_id=run_id)
        assert handle.status == "suspended", handle.error
        surfaces = python_surfaces(handle)
        request = str(next(iter(kx.approvals())).id)
    surfaces["kernelext approvals"] = cli("approvals", store=store)
    surfaces["kernelext show"] = cli("show", run_id, store=store)
    surfaces["kernelext runs"] = cli("runs", store=store)
    surfaces["kernelext approve"] = cli_process("approve", request, store=store)
    for surface, output in surfaces.items():
        assert unsafe(output) == [], (surface, output)
    for surface in ("kernelext approvals", "kx.approvals().text()", "kernelext approve"):
        assert MIXED in surfaces[surface], surface
    assert "142420" in surfaces["kernelext approvals"]


# -- nothing bypasses the door --------------------------------------------------------------------
HOSTILE = "\u202e\u200bp\u0430y\x1b"


def every_command(run_id: str, request: str, tmp_path: Path) -> dict[str, list[str]]:
    """Each command of the command line, with arguments that reach its output."""
    return {
        "approvals": [],
        "show": [run_id],
        "plan": [run_id],
        "runs": [],
        "sql": ["select id, agent from runs"],
        "reconcile": [run_id],
        "approve": [request],
        "reject": [request],  # decided: the refusal names it
        "answer": [run_id, "x"],  # no question: the refusal names the run
        "stop": [run_id],
        "sweep": [],
        "run": [str(tmp_path / f"missing{HOSTILE}.ipynb")],
    }


def test_every_command_prints_through_the_door(tmp_path: Path) -> None:
    run_id = f"catalogue-{HOSTILE}"
    with a_store(tmp_path) as store:
        handle = payer.run(HOSTILE, f"to {HOSTILE}", HOSTILE, run_id=run_id)
        assert handle.status == "suspended", handle.error
        request = str(next(iter(kx.approvals())).id)
    commands = every_command(run_id, request, tmp_path)
    assert set(commands) == set(build_parser().command_names), (
        "a new command: add it here with arguments that reach its output"
    )
    for name, args in commands.items():
        output = cli_process(name, *args, store=store)
        assert output.strip(), name
        assert unsafe(output) == [], (name, output)


DISPLAY_METHODS = {"__repr__", "__str__", "text", "text_summary", "status_text", "_repr_pretty_"}
# (file, class, method): why it may skip the door.
NOT_DISPLAYED = {
    ("kernelext/status.py", "_Str", "__str__"): "a status: one of a fixed set of words",
    ("kernelext/status.py", "_Str", "__repr__"): "a status: one of a fixed set of words",
    (
        "kernelext/_core/encoding/secrets.py",
        "StoreScrubber",
        "text",
    ): "scrubs stored text, shows none",
    ("kernelext/_store/columns.py", "Scrubber", "text"): "the scrubber's protocol, shows none",
}
DOORS = {"shows", "_shows", "shown", "shown_frame"}


def _uses_the_door(function: ast.FunctionDef) -> bool:
    decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in function.decorator_list}
    if decorators & DOORS:
        return True
    called = {
        getattr(node.func, "id", getattr(node.func, "attr", None))
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
    }
    return bool(called & DOORS)


def source_files() -> list[Path]:
    return sorted([*REPO.glob("kernelext/**/*.py"), *REPO.glob("widgets/*.py")])


def test_every_repr_and_text_of_kernelext_passes_the_door() -> None:
    bypass = []
    for path in source_files():
        tree = ast.parse(path.read_text())
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef) or fn.name not in DISPLAY_METHODS:
                    continue
                where = (str(path.relative_to(REPO)), cls.name, fn.name)
                if where not in NOT_DISPLAYED and not _uses_the_door(fn):
                    bypass.append(where)
    assert bypass == [], "decorate with kernelext._shown.shows (or list it, with why)"


def test_html_is_escaped_only_through_the_door() -> None:
    """``html.escape`` leaves bidi and zero-width characters in; ``shown_html`` does not."""
    offenders = []
    for path in source_files():
        if path.name == "_shown.py":
            continue
        text = path.read_text()
        if "html.escape(" in text or "from html import escape" in text:
            offenders.append(str(path.relative_to(REPO)))
    assert offenders == [], "escape HTML with kernelext._shown.shown_html"


def test_the_command_line_writes_only_to_the_streams_main_wraps() -> None:
    for path in sorted(REPO.glob("kernelext/_cli/*.py")):
        text = path.read_text()
        for raw in ("sys.__stdout__", "sys.__stderr__", "os.write(", ".buffer.write("):
            assert raw not in text, (path.name, raw)


# -- registered secrets hide whole values only ---------------------------------------------------
@kx.agent(name="pin-payer")
def pin_payer(run: kx.Run, pin: int) -> None:
    with run.step("pay"):
        run.fact("pin", pin, kind="credential")
        pay("bob@bank.com", "1987 6543", 142420)


def test_a_pin_does_not_hide_an_amount_that_holds_its_digits(tmp_path: Path) -> None:
    with a_store(tmp_path) as store:
        handle = pin_payer.run(1424, run_id="pin-run")
        assert handle.status == "suspended", handle.error
        assert '"amount":142420' in kx.approvals().text()
    shown_there = cli("approvals", store=store)
    assert "amount = 142420" in shown_there, shown_there
    with pytest.raises(ValueError, match=r"at least 8 characters.*name='pin'"):
        kx.secrets.register("1424")
