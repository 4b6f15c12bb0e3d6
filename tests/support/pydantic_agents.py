"""Pydantic AI agents for the tests, built the same way in every process.

``payer(llm_url, delivery_url)``: an agent whose ``pay`` tool POSTs a payment to the local
delivery server (what is counted), answering from the scripted model server through
Pydantic AI's own OpenAI chat model. The first call of ``pay`` in this process can be held
(``HOLD``, of support.agent_parts) until a test asked for a Stop. Options: ``approval=True``
declares ``pay`` as needing approval; a payment to someone ``away`` asks the model to retry
(noted in ``ASKED_AWAY``); ``accepts`` is an output validator's test of the final answer (a
refused answer is sent back to the model to try again); ``durable=True`` builds the agent
with kernelext's durability capability (``handler``: its ``event_stream_handler``);
``approve_over=N``: ``pay`` asks for approval itself (raises ``ApprovalRequired``) for an
amount over ``N`` not yet approved, each call noted in ``CALLED`` as
``(who, ctx.tool_call_approved)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.exceptions import ApprovalRequired
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from support.agent_parts import HOLD, PAY_SCRIPT, close_clients, openai_client, serve_payer
from support.http_server import post_json

__all__ = ["ASKED_AWAY", "CALLED", "HOLD", "PAY_SCRIPT", "close_clients", "model_for", "payer"]

ASKED_AWAY: list[str] = []
CALLED: list[tuple[str, bool]] = []


def model_for(llm_url: str) -> OpenAIChatModel:
    return OpenAIChatModel(
        "scripted", provider=OpenAIProvider(openai_client=openai_client(llm_url))
    )


def payer(
    llm_url: str,
    delivery_url: str,
    *,
    approval: bool = False,
    accepts: Callable[[str], bool] | None = None,
    away: frozenset[str] = frozenset(),
    durable: bool = False,
    approve_over: int | None = None,
    handler: Any = None,
) -> Agent[None, str]:
    import kernelext as kx

    agent = Agent(
        model_for(llm_url),
        name="payer",
        instructions="Pay who you are told.",
        capabilities=[kx.pydantic_ai.durability(event_stream_handler=handler)] if durable else None,
    )

    @agent.tool(requires_approval=approval)
    def pay(ctx: RunContext[None], who: str, amount: int) -> str:
        """Pay someone an amount of dollars."""
        CALLED.append((who, ctx.tool_call_approved))
        if approve_over is not None and amount > approve_over and not ctx.tool_call_approved:
            raise ApprovalRequired(metadata={"over": approve_over})
        if who in away:
            ASKED_AWAY.append(who)
            raise ModelRetry(f"{who} is away: pay someone else")
        if HOLD.holds(who):
            HOLD.wait_here()
        answer = post_json(f"{delivery_url}/pay/{who}", {"who": who, "amount": amount})
        return f"paid {who} {amount} ({answer.status})"

    if accepts is not None:
        test = accepts

        @agent.output_validator
        def checked(output: str) -> str:
            if not test(output):
                raise ModelRetry(f"{output!r} is not the answer wanted")
            return output

    return agent


def main(argv: list[str]) -> int:
    """``python -m support.pydantic_agents start|resume RUN_ID LLM_URL DELIVERY_URL
    [key=value...]`` (``support.agent_parts.serve_payer``); ``approval=1``: ``pay`` needs
    approval; ``approve_over=N``: ``pay`` asks for it over ``N``."""
    import kernelext as kx

    def made(llm_url: str, delivery_url: str, options: dict[str, str]) -> Agent[None, str]:
        over = options.get("approve_over")
        return payer(
            llm_url, delivery_url, approval=bool(options.get("approval")),
            approve_over=None if over is None else int(over),
        )  # fmt: skip

    return serve_payer(argv, kx.pydantic_ai, made)


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
