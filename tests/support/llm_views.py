"""What the tests of an LLM run's views share: a client of the scripted model server, no
prices left over between tests, the refund desk's tools, and the run as ``kernelext show``
prints it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from support.clients import closed_after
from support.llm_server import LLMServer

if TYPE_CHECKING:
    from kernelext._adapters.tools import Tools

MODEL = "scripted"


@pytest.fixture(autouse=True)
def no_prices() -> Iterator[None]:
    """No model price kept from another test, none left to the next."""
    from kernelext._core.views import conversation

    conversation.PRICES.clear()
    yield
    conversation.PRICES.clear()


def client_of(llm: LLMServer, **options: Any) -> Any:
    """An OpenAI client of ``llm``, recorded by kernelext (``options`` go to kx.openai)."""
    from openai import OpenAI

    import kernelext as kx

    plain = closed_after(OpenAI(base_url=llm.base_url, api_key="EMPTY", max_retries=0))
    return kx.openai(plain, **options)


def refund_desk(lookup_order: Callable[[str], Any]) -> Tools:
    """The tools of the refund conversations, each a recorded effect: the test's
    ``lookup_order`` (which may wait for the test), then ``refund`` and ``send_email``,
    which answer at once."""
    import kernelext as kx
    from kernelext._adapters.tools import Tools

    @kx.effect
    def refund(order_id: str, amount: float) -> Any:
        return {"refunded": amount}

    @kx.effect
    def send_email(to: str, subject: str, body: str) -> Any:
        return {"sent": to}

    return Tools(kx.effect(lookup_order), refund, send_email)


def kernelext_show(run_id: str, store_path: Path | str, *options: str) -> str:
    """What ``kernelext show RUN`` prints (in another process); it must succeed."""
    return subprocess.run(
        [sys.executable, "-m", "kernelext", "show", run_id, *options, "--store", str(store_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
        check=True,
    ).stdout
