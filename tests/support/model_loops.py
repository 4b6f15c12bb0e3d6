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
from dataclasses import dataclass
from typing import Any

from anthropic import Anthropic
from openai import OpenAI

import kernelext as kx
from support.clients import closed_after
from support.llm_server import LLMServer

__all__ = ["LOOPS", "Loop", "anthropic_reply", "anthropic_take"]

Loop = Callable[
    [LLMServer, Any, Callable[[], str], Callable[[], str], Callable[[int], None]],
    Callable[[kx.Run, str], str],
]
TURNS = 4


Prompt = Callable[[], str]


def anthropic_ask(client: Any, tools: Any, system: Prompt, messages: list[Any]) -> Any:
    return client.messages.create(
        model="m", max_tokens=10, system=system(), messages=messages,
        tools=tools.for_anthropic(),
    )  # fmt: skip


def anthropic_reply(client: Any, tools: Any, turn: int, **ask: Any) -> Any:
    """The model's reply to ``ask`` with the ``tools``: streamed (``messages.stream``) on odd
    turns, created on even ones."""
    if turn % 2:
        with client.messages.stream(**ask, tools=tools.for_anthropic()) as stream:
            return stream.get_final_message()
    return client.messages.create(**ask, tools=tools.for_anthropic())


def anthropic_take(reply: Any, tools: Any, messages: list[Any]) -> str | None:
    """``reply`` added to ``messages``; its text when the model answered, else None, with
    the results of the tools it asked for added too."""
    messages.append({"role": "assistant", "content": reply.content})
    if reply.stop_reason != "tool_use":
        return "".join(b.text for b in reply.content if b.type == "text")
    messages.append({"role": "user", "content": tools.call_all(reply)})
    return None


def chat_ask(client: Any, tools: Any, system: Prompt, messages: list[Any]) -> Any:
    return client.chat.completions.create(model="m", messages=messages, tools=tools)


def chat_take(answer: Any, tools: Any, messages: list[Any]) -> str | None:
    message = answer.choices[0].message
    messages.append(message)
    if not message.tool_calls:
        return str(message.content)
    messages += tools.call_all(message)
    return None


def responses_ask(client: Any, tools: Any, system: Prompt, items: list[Any]) -> Any:
    return client.responses.create(
        model="m", instructions=system(), input=items, tools=tools.for_responses()
    )


def responses_take(response: Any, tools: Any, items: list[Any]) -> str | None:
    items += [item.model_dump(exclude_unset=True) for item in response.output]
    if not any(item.type == "function_call" for item in response.output):
        return str(response.output_text)
    items += tools.call_all(response)
    return None


@dataclass(frozen=True)
class Api:
    """One API's shape: its recorded client, its first messages (``system`` goes in them for
    chat completions only), one model call and what is made of its answer: the messages it
    adds, and the last text when the model called no tool."""

    client: Callable[[LLMServer], Any]
    first: Callable[[Prompt, Prompt], list[Any]]
    ask: Callable[[Any, Any, Prompt, list[Any]], Any]
    take: Callable[[Any, Any, list[Any]], str | None]

    def loop(
        self, llm: LLMServer, tools: Any, system: Prompt, question: Prompt,
        after: Callable[[int], None],
    ) -> Callable[[kx.Run, str], str]:  # fmt: skip
        client = self.client(llm)

        def ask(run: kx.Run, _: str) -> str:
            messages = self.first(system, question)
            for turn in range(TURNS):
                reply = self.ask(client, tools, system, messages)
                after(turn)
                text = self.take(reply, tools, messages)
                if text is not None:
                    return text
            return "too many turns"

        return ask


def the_question(system: Prompt, question: Prompt) -> list[Any]:
    return [{"role": "user", "content": question()}]


def system_and_question(system: Prompt, question: Prompt) -> list[Any]:
    return [{"role": "system", "content": system()}, {"role": "user", "content": question()}]


def openai_client(llm: LLMServer) -> Any:
    return kx.openai(closed_after(OpenAI(base_url=llm.base_url, api_key="sk-test", max_retries=0)))


def anthropic_client(llm: LLMServer) -> Any:
    return kx.anthropic(
        closed_after(Anthropic(base_url=llm.url, api_key="sk-ant-test", max_retries=0))
    )


APIS = {
    "anthropic": Api(anthropic_client, the_question, anthropic_ask, anthropic_take),
    "chat": Api(openai_client, system_and_question, chat_ask, chat_take),
    "responses": Api(openai_client, the_question, responses_ask, responses_take),
}
LOOPS: dict[str, Loop] = {name: api.loop for name, api in APIS.items()}
