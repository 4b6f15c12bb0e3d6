"""Agents of the OpenAI Agents SDK for the tests, built the same way in every process.

``payer(llm_url, delivery_url)``: an agent whose ``pay`` tool POSTs a payment to the local
delivery server (what is counted), answering from the scripted model server. The first
call of ``pay`` in this process can be held (``HOLD``, of support.agent_parts) until a test
asked for a Stop.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIResponsesModel, function_tool, set_tracing_disabled

from support.agent_parts import HOLD, PAY_SCRIPT, close_clients, openai_client, serve_payer
from support.http_server import post_json

__all__ = ["HOLD", "PAY_SCRIPT", "close_clients", "model_for", "payer"]

set_tracing_disabled(True)  # the SDK would send its traces to a server of its own


def model_for(llm_url: str) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(model="scripted", openai_client=openai_client(llm_url))


def payer(llm_url: str, delivery_url: str, **options: Any) -> Agent[Any]:
    @function_tool(**options)
    def pay(who: str, amount: int) -> str:
        """Pay someone an amount of dollars."""
        if HOLD.holds(who):
            HOLD.wait_here()
        answer = post_json(f"{delivery_url}/pay/{who}", {"who": who, "amount": amount})
        return f"paid {who} {amount} ({answer.status})"

    return Agent(
        name="payer", instructions="Pay who you are told.", tools=[pay], model=model_for(llm_url)
    )


def main(argv: list[str]) -> int:
    """``python -m support.sdk_agents start|resume RUN_ID LLM_URL DELIVERY_URL [key=value...]``
    (``support.agent_parts.serve_payer``); ``approval=1``: ``pay`` needs approval."""
    import kernelext as kx

    def made(llm_url: str, delivery_url: str, options: dict[str, str]) -> Agent[Any]:
        tool_options = {"needs_approval": True} if options.get("approval") else {}
        return payer(llm_url, delivery_url, **tool_options)

    return serve_payer(argv, kx.openai_agents, made)


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
