"""``kernelext approvals`` tells how to answer each waiting question, and the hint works.

A batch (``run.map``) whose items each ask a question waits on several at once: each
printed ``answer with:`` line, run as it is (VALUE filled in) in a real subprocess against
the real DuckDB file, answers exactly its own question.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from support.cli import kernelext_cli as kernelext

import kernelext as kx


@kx.agent(name="batch-asker")
def asker(run: kx.Run, items: list[str]) -> list[int]:
    return run.map(lambda item: run.ask(f"Seats for {item}?", schema=int), items, concurrency=2)


def test_each_question_s_hint_answers_that_question(store: Any, store_path: Path) -> None:
    assert asker.start(["a", "b", "c"], run_id="seats").wait(30) == "suspended"
    assert len(kx.questions("seats")) == 3
    store.close()
    listing = kernelext("approvals", store=store_path)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    asked = {  # the prompt a hint answers: the line before it
        line.split("answer with:", 1)[1].strip(): lines[i - 1].split("): ", 1)[1].split("?")[0]
        for i, line in enumerate(lines)
        if "answer with:" in line
    }
    assert len(asked) == 3, listing.stdout
    seats = {"Seats for a": 1, "Seats for b": 2, "Seats for c": 3}
    for hint, prompt in asked.items():
        words = shlex.split(hint)
        assert words[:2] == ["kernelext", "answer"], hint
        value = str(seats[prompt])
        done = kernelext(*[value if w == "VALUE" else w for w in words[1:]], store=store_path)
        assert done.returncode == 0, (hint, done.stdout, done.stderr)
    again = kx.open_store(str(store_path))
    try:
        answers = kx.sql("SELECT prompt, answer FROM questions ORDER BY prompt").values.tolist()
    finally:
        again.close()
    assert [(p, int(a)) for p, a in answers] == [
        ("Seats for a?", 1),
        ("Seats for b?", 2),
        ("Seats for c?", 3),
    ], answers
