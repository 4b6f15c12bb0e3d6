"""OpenAI Agents SDK runs under kernelext, attacked: each test names a promise of
``kx.openai_agents`` and a way it was found not to hold (the real SDK, a scripted model
server and a delivery server on 127.0.0.1, a real DuckDB store)."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import (
    Agent,
    RunConfig,
    RunContextWrapper,
    ToolOutputText,
    function_tool,
    handoff,
)
from pydantic import BaseModel
from support.http_server import DeliveryServer, post_json
from support.llm_server import LLMServer
from support.sdk_agents import close_clients, model_for

ONE_PAY = [{"tool_calls": [{"name": "pay", "arguments": {"who": "bob"}}]}, {"content": "done"}]
TWO_TURNS = [
    {"tool_calls": [{"name": "whoami", "arguments": {"who": "a"}}]},
    {"tool_calls": [{"name": "whoami", "arguments": {"who": "b"}}]},
    {"content": "done"},
]


class Receipt(BaseModel):
    who: str
    at: datetime.datetime


@pytest.fixture
def closing() -> Iterator[None]:
    yield
    close_clients()


def _pay_tool(url: str, **options: Any) -> Any:
    @function_tool(**options)
    def pay(who: str) -> str:
        """Pay someone."""
        return f"paid {who} ({post_json(f'{url}/pay/{who}', {'who': who}).status})"

    return pay


def _stopped_in_a_tool_then_resumed(
    agent: Agent[Any],
    prompt: str,
    run_id: str,
    reached: threading.Event,
    released: threading.Event,
) -> Any:
    """Starts run ``run_id`` of ``agent`` and stops it while a tool of it waits (the tool
    sets ``reached``, then waits for ``released``); lets the tool end, resumes the run and
    returns its handle, completed."""
    import kernelext as kx

    handle = kx.openai_agents.start(agent, prompt, run_id=run_id)
    assert reached.wait(30)
    handle.stop()
    released.set()
    assert handle.wait(60) == "suspended", handle.error
    again = kx.resume(run_id)
    assert again.wait(60) == "completed", again.error
    return again


class WhoAmI:
    """A ``whoami`` tool that answers with the run's context's user (each noted in
    ``seen``), held the first time until the test let it go."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.reached, self.released = threading.Event(), threading.Event()

    def agent(self, llm: LLMServer) -> Agent[Any]:
        @function_tool
        def whoami(ctx: RunContextWrapper[Any], who: str) -> str:
            """Who is asking."""
            if not self.released.is_set():
                self.reached.set()
                self.released.wait(30)
            self.seen.append(ctx.context["user"])
            return str(ctx.context["user"])

        return Agent(name="ctx", instructions="x", tools=[whoami], model=model_for(llm.base_url))

    def stopped_for_alice(self, agent: Agent[Any], run_id: str) -> None:
        """Alice's run, stopped while its first ``whoami`` is held; then suspended."""
        import kernelext as kx

        alice = kx.openai_agents.start(agent, "for alice", run_id=run_id, context={"user": "alice"})
        assert self.reached.wait(30)
        alice.stop()
        self.released.set()
        assert alice.wait(60) == "suspended"


class Opaque:
    def __str__(self) -> str:
        return "an object of its own"


RESULTS = {
    "pydantic": lambda: Receipt(who="bob", at=datetime.datetime(2026, 1, 1, 12, 0)),
    "sdk text": lambda: ToolOutputText(text="paid"),
    "sdk texts": lambda: [ToolOutputText(text="paid"), ToolOutputText(text="twice")],
    "datetime": lambda: datetime.datetime(2026, 1, 1, 12, 0),
    "bytes": lambda: b"\x00paid",
    "object": Opaque,
}


@pytest.mark.parametrize("kind", sorted(RESULTS))
def test_a_tool_result_of_any_type_is_recorded_and_replayed(
    kind: str, store: Any, delivery_server: DeliveryServer, closing: None
) -> None:
    """A run whose tool returns what the SDK accepts completes, and its resume replays the
    result so that the model is asked each turn once (the same text reaches it)."""

    script = [
        {"tool_calls": [{"name": "receipt", "arguments": {"who": "bob"}}]},
        {"tool_calls": [{"name": "receipt", "arguments": {"who": "ann"}}]},
        {"content": "ok"},
    ]
    reached, released = threading.Event(), threading.Event()

    @function_tool
    def receipt(who: str) -> Any:
        """Pay and return a receipt."""
        post_json(f"{delivery_server.url}/pay/{who}", {"who": who})
        if not released.is_set():
            reached.set()
            released.wait(30)
        return RESULTS[kind]()

    with LLMServer(script=script) as llm:
        agent = Agent(name="rc", instructions="pay", tools=[receipt], model=model_for(llm.base_url))
        again = _stopped_in_a_tool_then_resumed(agent, "pay", "receipt-1", reached, released)
        assert again.result == "ok"
        assert delivery_server.count() == 2
        assert set(llm.per_turn().values()) == {1}


def test_a_resumed_run_keeps_its_own_context(store: Any, closing: None) -> None:
    import kernelext as kx

    whoami = WhoAmI()
    seen = whoami.seen
    with LLMServer(script=TWO_TURNS) as llm:
        agent = whoami.agent(llm)
        whoami.stopped_for_alice(agent, "ctx-a")
        bob = kx.openai_agents.start(agent, "for bob", run_id="ctx-b", context={"user": "bob"})
        assert bob.wait(60) == "completed", bob.error
        seen.clear()
        again = kx.resume("ctx-a")
        assert again.wait(60) == "completed", again.error
        assert seen == ["alice"]  # alice's run, alice's context (bob's was used)


def test_max_turns_of_one_run_does_not_limit_the_next(store: Any, closing: None) -> None:
    import kernelext as kx

    @function_tool
    def whoami(who: str) -> str:
        """Who is asking."""
        return who

    with LLMServer(script=TWO_TURNS) as llm:
        agent = Agent(name="turns", instructions="x", tools=[whoami], model=model_for(llm.base_url))
        short = kx.openai_agents.start(agent, "short", run_id="turns-1", max_turns=1)
        assert short.wait(60) == "failed"
        default = kx.openai_agents.start(agent, "default", run_id="turns-2")
        assert default.wait(60) == "completed", default.error


def test_run_config_model_serves_agents_without_a_model(
    store: Any, delivery_server: DeliveryServer, closing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernelext as kx

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with LLMServer(script=ONE_PAY) as llm:
        agent = Agent(name="nm", instructions="x", tools=[_pay_tool(delivery_server.url)])
        config = RunConfig(model=model_for(llm.base_url))
        handle = kx.openai_agents.start(agent, "go", run_id="cfg-1", run_config=config)
        assert handle.wait(60) == "completed", handle.error  # Runner.run itself completes
        assert delivery_server.count() == 1


def test_on_handoff_runs_once_across_a_resume(
    store: Any, delivery_server: DeliveryServer, closing: None
) -> None:

    reached, released = threading.Event(), threading.Event()
    script = [
        {"tool_calls": [{"name": "transfer_to_billing", "arguments": {}}]},
        {"tool_calls": [{"name": "pay", "arguments": {"who": "bob"}}]},
        {"content": "done"},
    ]

    @function_tool
    def pay(who: str) -> str:
        """Pay someone."""
        reached.set()
        released.wait(30)
        return who

    def notify(ctx: Any) -> None:  # the SDK's place for a handoff's side effect
        post_json(f"{delivery_server.url}/notify", {"handoff": "billing"})

    with LLMServer(script=script) as llm:
        billing = Agent(
            name="billing", instructions="bill", tools=[pay], model=model_for(llm.base_url)
        )
        triage = Agent(
            name="triage",
            instructions="route",
            handoffs=[handoff(billing, on_handoff=notify)],
            model=model_for(llm.base_url),
        )
        _stopped_in_a_tool_then_resumed(triage, "help", "handoff-1", reached, released)
        assert delivery_server.count(path="/notify") == 1


def test_parallel_calls_finish_when_one_needs_approval(
    store: Any, delivery_server: DeliveryServer, closing: None
) -> None:
    import kernelext as kx

    script = [
        {"tool_calls": [{"name": "pay", "arguments": {"who": "bob"}},
                        {"name": "big", "arguments": {"who": "x"}}]},
        {"content": "done"},
    ]  # fmt: skip
    released = threading.Event()

    @function_tool
    def pay(who: str) -> str:
        """Pay someone (slowly)."""
        released.wait(2)
        post_json(f"{delivery_server.url}/pay/{who}", {"who": who})
        return who

    big = _pay_tool(delivery_server.url, name_override="big", needs_approval=True)
    with LLMServer(script=script) as llm:
        agent = Agent(name="par", instructions="x", tools=[pay, big], model=model_for(llm.base_url))
        handle = kx.openai_agents.start(agent, "go", run_id="par-1")
        assert handle.wait(60) == "suspended", handle.error
        released.set()
        assert delivery_server.wait_for(1, timeout=10) == 1
        assert list(kx.reconcile("par-1")) == []  # pay was made: not cut to unknown


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_call_needing_approval_suspends_the_run_for_it(
    decision: str, store: Any, delivery_server: DeliveryServer, closing: None
) -> None:
    """The run waits for the approval (not as stopped by a person), and the decision goes
    on by itself in the process that runs it, as for any effect."""
    import kernelext as kx

    pay = _pay_tool(delivery_server.url, needs_approval=True)
    with LLMServer(script=ONE_PAY) as llm:
        agent = Agent(name="ap", instructions="x", tools=[pay], model=model_for(llm.base_url))
        handle = kx.openai_agents.start(agent, "go", run_id="ap-1")
        assert handle.wait(60) == "suspended", handle.error
        assert handle.info()["reason"] == "approval"
        (request,) = kx.approvals("ap-1")
        again = getattr(request, decision)()
        assert again is not None, "the decision did not resume the run"
        assert again.wait(60) == "completed", again.error
        assert delivery_server.count() == (1 if decision == "approve" else 0)
        assert set(llm.per_turn().values()) == {1}


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_an_approval_asked_inside_a_tool_decides_the_call_made_there(
    decision: str, store: Any, delivery_server: DeliveryServer, closing: None
) -> None:
    """A tool whose body calls an ``@kx.effect(needs_approval=True)``: the tool call is made
    again once a person decided (not left for kx.reconcile), the approved call once."""
    import kernelext as kx

    @kx.effect(needs_approval=True)
    def wire(who: str) -> int:
        return post_json(f"{delivery_server.url}/pay/{who}", {"who": who}).status

    @function_tool
    def pay(who: str) -> str:
        """Pay someone."""
        return f"paid {who} ({wire(who)})"

    with LLMServer(script=ONE_PAY) as llm:
        agent = Agent(name="in", instructions="x", tools=[pay], model=model_for(llm.base_url))
        handle = kx.openai_agents.start(agent, "go", run_id="inner-1")
        assert handle.wait(60) == "suspended", handle.error
        (request,) = kx.approvals("inner-1")
        assert request.tool == "wire"
        again = getattr(request, decision)()
        assert again.wait(60) == "completed", again.error
        assert delivery_server.count() == (1 if decision == "approve" else 0)
        assert list(kx.reconcile("inner-1")) == []
        assert set(llm.per_turn().values()) == {1}


class _Unsendable:
    pass


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(None, id="none"),
        pytest.param(_Unsendable(), id="object"),
        pytest.param({"role": "user", "content": "hi"}, id="one item not in a list"),
        pytest.param(
            [{"role": "user", "content": "hi", "when": datetime.datetime(2026, 1, 1)}],
            id="item holding a datetime",
        ),
        pytest.param([{"role": "user", "content": _Unsendable()}], id="item holding an object"),
    ],
)
def test_an_input_the_model_cannot_be_given_is_refused_before_the_run(
    given: Any, store: Any, closing: None
) -> None:
    """Bad input gets an error that says what to pass; no run is made and the model is
    never asked (it would have been handed a type name, or the SDK's AttributeError)."""
    import kernelext as kx

    with LLMServer(script=[{"content": "done"}]) as llm:
        agent = Agent(name="in", instructions="x", model=model_for(llm.base_url))
        with pytest.raises(TypeError, match="input"):
            kx.openai_agents.start(agent, given, run_id="in-1")
        assert llm.count() == 0
        assert len(kx.runs()) == 0
        ok = kx.openai_agents.start(agent, [{"role": "user", "content": "hi"}], run_id="in-1")
        assert ok.wait(60) == "completed", ok.error  # the id is free, the store intact


def test_a_secret_in_the_models_answer_is_never_replayed_masked_to_a_tool(
    store: Any, closing: None
) -> None:
    """A registered secret is masked in the recorded answer: a resume that replayed it would
    hand ``***`` to the tool (approved as ``pay(who='***')``). The resume refuses instead,
    saying why, and the tool is never called with the masked value."""
    import kernelext as kx

    kx.secrets.register("hunter2-account")
    seen: list[str] = []

    @function_tool(needs_approval=True)
    def pay(who: str) -> str:
        """Pay someone."""
        seen.append(who)
        return f"paid {who}"

    script = [
        {"tool_calls": [{"name": "pay", "arguments": {"who": "hunter2-account"}}]},
        {"content": "done"},
    ]
    with LLMServer(script=script) as llm:
        agent = Agent(name="sec", instructions="x", tools=[pay], model=model_for(llm.base_url))
        handle = kx.openai_agents.start(agent, "go", run_id="sec-1")
        assert handle.wait(60) == "suspended", handle.error
        (request,) = kx.approvals("sec-1")
        again = request.approve()
        assert again is not None
        assert again.wait(60) == "failed"
        assert "held a registered secret" in str(again.error)
        assert seen == []  # never with ***


def test_a_refused_start_with_a_taken_run_id_leaves_that_runs_context(
    store: Any, closing: None
) -> None:
    import kernelext as kx

    whoami = WhoAmI()
    seen = whoami.seen
    with LLMServer(script=TWO_TURNS) as llm:
        agent = whoami.agent(llm)
        whoami.stopped_for_alice(agent, "taken")
        with pytest.raises(kx.RunStateError):
            kx.openai_agents.start(agent, "for eve", run_id="taken", context={"user": "eve"})
        seen.clear()
        again = kx.resume("taken")
        assert again.wait(60) == "completed", again.error
        assert seen == ["alice"]


def test_a_run_id_that_is_not_text_gets_kernelexts_error(store: Any, closing: None) -> None:
    import kernelext as kx

    with LLMServer(script=[{"content": "done"}]) as llm:
        agent = Agent(name="rid", instructions="x", model=model_for(llm.base_url))
        with pytest.raises(kx.NameNotText, match="run_id"):
            kx.openai_agents.start(agent, "hi", run_id=["r-1"])  # type: ignore[arg-type]
        assert llm.count() == 0
