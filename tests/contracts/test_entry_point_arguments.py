"""Every public entry point validates its arguments up front (issue 19 item 7).

The calls are generated from ``inspect.signature``: for each callable of ``kernelext.__all__``
and each method of the objects users get (a handle, approval and question items, unknown
effects, a plan, a revalidation), each parameter in turn gets an obviously wrong value
derived from its annotation (an int where a str is required, a str where a number or a
flag is, 42 where a function is, ...), the others a good one. The error must be a
``TypeError``/``ValueError`` or a kernelext error whose message names the parameter, never
an ``AttributeError``/``KeyError`` or a DuckDB error from deep inside, and no row is written.
"""

from __future__ import annotations

import inspect
import math
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kernelext as kx
from kernelext._store import Store
from kernelext.errors import KernelextError

# Entry points that legitimately take anything there, or are not called with arguments a
# user passes (each with its reason).
SKIP: dict[str, str] = {
    "__version__": "a string, not a callable",
    "checks": "a registry object; its methods are checked below",
    "credentials": "a registry object; its methods are checked below",
    "secrets": "a registry object; its methods are checked below",
    "Handle": "built by kernelext (agent.start, kx.resume); its methods are checked below",
    "Run": "built by kernelext for the agent; users get it as the agent's first argument",
    "ResumePlan": "a dataclass built by kx.plan; its methods are checked below",
    "Revalidation": "built by kx.revalidation; its methods are checked below",
    "mcp": "wraps any MCP session object (duck-typed)",
    "errors": "a module of error classes",
    "status": "a module of enums and tables",
    "langgraph": "a module; its functions take a compiled graph (test_adapter_langgraph.py)",
    "openai_agents": "a module; its functions take an SDK agent (test_adapter_openai_agents.py)",
    "pydantic_ai": "a module; its functions take a Pydantic AI agent (test_adapter_pydantic_ai.py)",
}
# Parameters that take anything on purpose.
ANYTHING = {
    ("answer", "value"): "the answer is checked against the question's schema",
    ("mark_applied", "result"): "any JSON value is a result",
    ("Question.answer", "value"): "checked against the question's schema (test_ask.py)",
    ("Agent.start", "args"): "the agent's own arguments",
}


def bad_values(annotation: str, default: Any) -> list[Any]:
    """Obviously wrong values for a parameter with this annotation."""
    a = annotation.replace(" ", "")
    if a in ("Any", "") or a == "inspect._empty":
        return []
    optional = "None" in a.split("|") or default is None
    values: list[Any] = []
    if "Store" in a:
        values.append("not-a-store")
    elif "ResumePlan" in a:
        values.append("a plan")
    elif "datetime" in a:
        values.append("yesterday")
    elif "Callable" in a or "ExpireCallback" in a:
        values.append(42)
    elif a.startswith(("bool", "bool|")):
        values.append("yes")
    elif "int" in a.split("|") and "str" in a.split("|"):  # a step: ordinal or key
        values.extend([1.5, [1]])
    elif "float" in a or a.split("|")[0] == "int":
        values.extend(["a", math.nan] if "float" in a else ["a"])
    elif (
        "Mapping" in a
        or a.startswith("dict")
        or a.startswith(("tuple", "list", "Iterable", "Sequence"))
    ):
        values.append(5)
    elif "str" in a:
        values.append(12345)
    if not optional and values and "str" in a.split("|")[0]:
        values.append(None)
    return values


def good_value(name: str, annotation: str, ctx: dict[str, Any], label: str = "") -> Any:
    for key in (f"{label}.{name}", name):  # one entry point's own value first
        if key in ctx:
            return ctx[key]
    if "str" in annotation:
        return "x"
    raise LookupError(f"no good value for {name}: {annotation}")


def calls(
    label: str, fn: Callable[..., Any], ctx: dict[str, Any]
) -> Iterator[tuple[str, str, Callable[[], Any]]]:
    """(label, parameter, call) for each parameter and each of its bad values."""
    sig = inspect.signature(fn)
    params = [
        p
        for p in sig.parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    required = {p.name: p for p in params if p.default is p.empty}
    for p in params:
        if (label.split(".")[-1], p.name) in ANYTHING or (label, p.name) in ANYTHING:
            continue
        annotation = str(p.annotation) if p.annotation is not p.empty else ""
        default = None if p.default is p.empty else p.default
        for bad in bad_values(annotation, default):
            args: list[Any] = []
            kwargs: dict[str, Any] = {}
            for q in params:
                if q is p:
                    value = bad
                elif q.name in required:
                    value = good_value(q.name, str(q.annotation), ctx, label)
                else:
                    continue
                if q.kind is q.POSITIONAL_ONLY:
                    args.append(value)
                else:
                    kwargs[q.name] = value

            def call(args: list[Any] = args, kwargs: dict[str, Any] = kwargs) -> Any:
                return fn(*args, **kwargs)

            # A positional-only parameter has no name a user writes (the function of a
            # decorator): the message names the call instead.
            named = label.split(".")[-1] if p.kind is p.POSITIONAL_ONLY else p.name
            yield label, f"{named}={bad!r}", call


def row_counts(store: Store) -> dict[str, int]:
    tables = ("runs", "steps", "effects", "events", "approvals", "questions", "facts", "snapshots")
    return {t: int(store.read(f"SELECT count(*) FROM {t}")[0][0]) for t in tables}


@kx.effect(needs_approval=True)
def pay_args_check(amount: int) -> int:
    return amount


@kx.agent(name="entry_point_args")
def waits_for_approval(run: kx.Run) -> None:
    with run.step("pay"):
        pay_args_check(5)


@kx.effect
def interrupted_args_check() -> None:
    raise KeyboardInterrupt  # mid-call: the outcome is unknown


@kx.agent(name="entry_point_unknown")
def leaves_an_unknown(run: kx.Run) -> None:
    with run.step("call"):
        interrupted_args_check()


@kx.agent(name="entry_point_question")
def asks(run: kx.Run) -> None:
    with run.step("ask"):
        run.ask("How many?", schema=int)


def model_clients() -> dict[str, Any]:
    """The clients ``kx.openai`` and ``kx.anthropic`` wrap (nothing is sent)."""
    from anthropic import Anthropic
    from openai import OpenAI

    local = "http://127.0.0.1:9"
    return {
        "openai.client": OpenAI(base_url=local, api_key="EMPTY"),
        "anthropic.client": Anthropic(base_url=local, api_key="EMPTY"),
    }


def entry_points(store: Store) -> Iterator[tuple[str, str, Callable[[], Any]]]:
    handle = waits_for_approval.start(run_id="args-run")
    assert handle.wait(30) == "suspended"
    leaves_an_unknown.start(run_id="args-unknown").wait(30)
    assert asks.start(run_id="args-question").wait(30) == "suspended"
    ctx: dict[str, Any] = {"run_id": "args-run", "store": store, **model_clients()}
    for name in kx.__all__:
        obj = getattr(kx, name)
        if name in SKIP or (isinstance(obj, type) and issubclass(obj, BaseException)):
            continue
        assert callable(obj), f"{name} is neither callable nor in SKIP"
        if name in ("Agent", "Effect"):
            continue  # the decorators agent/effect build them; checked through those
        yield from calls(name, obj, ctx)
    for registry in ("checks", "credentials", "secrets"):
        reg = getattr(kx, registry)
        for meth in ("register", "unregister", "add", "forget", "lookup", "refresh_for"):
            if hasattr(reg, meth):
                yield from calls(f"kx.{registry}.{meth}", getattr(reg, meth), ctx)
    [approval] = kx.approvals("args-run")
    for meth in ("approve", "reject"):
        yield from calls(f"Approval.{meth}", getattr(approval, meth), ctx)
    [unknown] = kx.reconcile("args-unknown")
    for meth in ("mark_applied", "mark_not_applied", "give_up"):
        yield from calls(f"UnknownEffect.{meth}", getattr(unknown, meth), ctx)
    [question] = kx.questions("args-question")
    yield from calls("Question.answer", question.answer, ctx)
    for meth in ("stop", "force_stop", "wait"):
        yield from calls(f"Handle.{meth}", getattr(handle, meth), ctx)
    yield from calls("Agent.start", waits_for_approval.start, ctx)
    plan = kx.plan("args-run")
    for meth in ("verify", "to_json"):
        yield from calls(f"ResumePlan.{meth}", getattr(plan, meth), ctx)


def test_every_public_entry_point_refuses_wrong_argument_types_up_front(store: Store) -> None:
    problems: list[str] = []
    checked = 0
    for label, what, call in list(entry_points(store)):
        before = row_counts(store)
        try:
            call()
        except (TypeError, ValueError, KernelextError) as exc:
            name = what.split("=")[0]
            if name not in str(exc):
                problems.append(f"{label}({what}): {type(exc).__name__} not naming it: {exc}")
        except Exception as exc:
            problems.append(f"{label}({what}): {type(exc).__module__}.{type(exc).__name__}: {exc}")
        else:
            problems.append(f"{label}({what}): accepted")
        checked += 1
        after = row_counts(store)
        if after != before:
            problems.append(f"{label}({what}): wrote rows {before} -> {after}")
    assert checked > 80
    assert not problems, "\n".join(problems)


def test_the_skip_list_names_real_entry_points() -> None:
    for name in SKIP:
        assert name in kx.__all__, name
    assert uuid  # imported for annotations in signatures


def test_the_run_methods_an_agent_calls_refuse_wrong_argument_types_up_front(
    store: Store,
) -> None:
    problems: list[str] = []
    ctx: dict[str, Any] = {"value": 1, "items": [1], "prompt": "How many?", "run_id": "r"}

    @kx.agent(name="entry_point_run_methods")
    def agent(run: kx.Run) -> None:
        with run.step("calls"):
            for meth in ("ask", "claim", "credential", "fact", "step", "steps", "suspend"):
                for label, what, call in calls(f"run.{meth}", getattr(run, meth), ctx):
                    try:
                        made = call()
                        if meth == "steps":
                            list(made)
                    except (TypeError, ValueError, KernelextError) as exc:
                        if what.split("=")[0] not in str(exc):
                            problems.append(f"{label}({what}): not naming it: {exc}")
                    except BaseException as exc:  # a stop too: the call was accepted
                        problems.append(f"{label}({what}): {type(exc).__name__}: {exc}")
                    else:
                        problems.append(f"{label}({what}): accepted")

    before = row_counts(store)
    handle = agent.start(run_id="run-methods")
    assert handle.wait(30) == "completed", handle.error
    assert not problems, "\n".join(problems)
    assert store.read("SELECT count(*) FROM facts")[0][0] == before["facts"]
    assert store.read("SELECT count(*) FROM claims")[0][0] == 0
