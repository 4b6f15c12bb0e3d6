"""The loops users write with ``kx.openai`` and ``kx.anthropic`` and ``kx.tools``, one per
shape of the APIs (Anthropic ``messages``, chat completions, the Responses API), for tests
that run the same agent in each against the scripted model server (``support.llm_server``).

``loop(llm, tools, system, question, after)`` is an ``@kx.agent`` function: ``system()`` and
``question()`` are the system prompt and the user's message as the agent computes them in
this run, ``after(n)`` is called after the model's answer of turn ``n`` (a bug can crash
there), and the loop returns the model's last text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anthropic import Anthropic
from openai import OpenAI

import kernelext as kx
from support.llm_server import LLMServer

__all__ = ["LOOPS", "Loop"]

Loop = Callable[
    [LLMServer, Any, Callable[[], str], Callable[[], str], Callable[[int], None]],
    Callable[[kx.Run, str], str],
]
TURNS = 4


def anthropic_loop(
    llm: LLMServer,
    tools: Any,
    system: Callable[[], str],
    question: Callable[[], str],
    after: Callable[[int], None],
) -> Callable[[kx.Run, str], str]:
    client: Any = kx.anthropic(Anthropic(base_url=llm.url, api_key="sk-ant-test", max_retries=0))

    def ask(run: kx.Run, _: str) -> str:
        messages: list[Any] = [{"role": "user", "content": question()}]
        for turn in range(TURNS):
            reply = client.messages.create(
                model="m", max_tokens=10, system=system(), messages=messages,
                tools=tools.for_anthropic(),
            )  # fmt: skip
            after(turn)
            messages.append({"role": "assistant", "content": reply.content})
            if reply.stop_reason != "tool_use":
                return "".join(b.text for b in reply.content if b.type == "text")
            messages.append({"role": "user", "content": tools.call_all(reply)})
        return "too many turns"

    return ask


def chat_loop(
    llm: LLMServer,
    tools: Any,
    system: Callable[[], str],
    question: Callable[[], str],
    after: Callable[[int], None],
) -> Callable[[kx.Run, str], str]:
    client: Any = kx.openai(OpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0))

    def ask(run: kx.Run, _: str) -> str:
        messages: list[Any] = [
            {"role": "system", "content": system()},
            {"role": "user", "content": question()},
        ]
        for turn in range(TURNS):
            answer = client.chat.completions.create(model="m", messages=messages, tools=tools)
            after(turn)
            message = answer.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                return str(message.content)
            messages += tools.call_all(message)
        return "too many turns"

    return ask


def responses_loop(
    llm: LLMServer,
    tools: Any,
    system: Callable[[], str],
    question: Callable[[], str],
    after: Callable[[int], None],
) -> Callable[[kx.Run, str], str]:
    client: Any = kx.openai(OpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0))

    def ask(run: kx.Run, _: str) -> str:
        items: list[Any] = [{"role": "user", "content": question()}]
        for turn in range(TURNS):
            response = client.responses.create(
                model="m", instructions=system(), input=items, tools=tools.for_responses()
            )
            after(turn)
            items += [item.model_dump(exclude_unset=True) for item in response.output]
            if not any(item.type == "function_call" for item in response.output):
                return str(response.output_text)
            items += tools.call_all(response)
        return "too many turns"

    return ask


LOOPS: dict[str, Loop] = {
    "anthropic": anthropic_loop,
    "chat": chat_loop,
    "responses": responses_loop,
}
