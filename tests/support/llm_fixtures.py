"""The ``llm`` fixture: the scripted model server (``support.llm_server``), its requests
logged under the test's ``tmp_path``; offered by the conftest of tests/surfaces and
tests/views (a test module with a fixture of its own named ``llm`` keeps that one).

What it answers: the script of ``@pytest.mark.parametrize("llm", [SCRIPT], indirect=True)``,
else the test module's ``LLM_SCRIPT``, else ``DEMO_SCRIPT``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.llm_server import DEMO_SCRIPT, LLMServer


@pytest.fixture
def llm(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LLMServer]:
    script = getattr(request, "param", None)
    if script is None:
        script = getattr(request.module, "LLM_SCRIPT", DEMO_SCRIPT)
    with LLMServer(script=list(script), log_path=tmp_path / "llm.jsonl") as server:
        yield server
