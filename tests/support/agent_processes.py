"""The payer agent of the agent-framework adapter tests in processes of its own (a restarted
kernel): ``python -m support.sdk_agents`` or ``python -m support.pydantic_agents``
(``support.agent_parts.serve_payer``), or any module, with the tests on its path.

``in_new_process(module, *argv)``: run it to its end; ``run_end(done)``: the run's end it
printed, the process having succeeded; ``killed_after_first_payment``: a run started in a
process SIGKILLed while its first payment waits for the delivery server's answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.http_server import DeliveryServer
from support.llm_server import LLMServer

TESTS_DIR = Path(__file__).resolve().parents[1]


def env_with_tests_on_path() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS_DIR)}


def in_new_process(
    module: str, *argv: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        env=env_with_tests_on_path(), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def run_end(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON line the payer's process printed last; the process must have succeeded."""
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def killed_after_first_payment(
    module: str, run_id: str, llm: LLMServer, deliveries: DeliveryServer
) -> None:
    """``module start RUN_ID`` in a new process, SIGKILLed once its first payment reached
    ``deliveries``, which records it and holds its answer: the kernel dies waiting for it."""
    deliveries.delay = 60
    worker = subprocess.Popen(
        [sys.executable, "-m", module, "start", run_id, llm.base_url, deliveries.url],
        env=env_with_tests_on_path(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deliveries.wait_for(1, timeout=60)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.communicate(timeout=30)
    deliveries.delay = 0
