"""``kx.openai``: a call's ``extra_query`` is sent as given and stored with its names only.

A real local model server (tests/support/llm_server.py) answers; the store is a real DuckDB
file, read back row by row and byte by byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openai import OpenAI
from support.clients import closed_after
from support.llm_server import LLMServer

import kernelext as kx
from kernelext._adapters.openai import wrap_openai
from kernelext._core.encoding.secrets import SECRETS
from kernelext.status import Status

QUERY_SECRET = "qry-" + "K3YV4LU3" * 3  # e.g. a gateway's ?key=... or an Azure ?sig=...
PLAIN = "2024-10-21"


def test_extra_query_values_never_reach_the_store(
    store: Any, store_path: Path, llm: LLMServer
) -> None:
    client = wrap_openai(
        closed_after(OpenAI(base_url=llm.base_url, api_key="EMPTY", max_retries=0))
    )

    @kx.agent(name="openai-query")
    def agent(run: kx.Run) -> str:
        reply = client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "hi"}],
            extra_query={"key": QUERY_SECRET, "api-version": PLAIN},
        )
        return str(reply.choices[0].message.content)

    try:
        assert agent.start(run_id="query").wait(30) == Status.COMPLETED
        stored = kx.sql("SELECT args FROM effects WHERE run_id = 'query'").to_json()
        assert "api-version" in stored and "key" in stored  # the names are kept
        assert QUERY_SECRET not in stored and PLAIN not in stored  # no value is
        assert "***redacted***" in stored
        store.close()
        files = [p for p in store_path.parent.rglob("*") if p.is_file()]
        assert not [p for p in files if QUERY_SECRET.encode() in p.read_bytes()]
    finally:
        SECRETS.forget(QUERY_SECRET)
