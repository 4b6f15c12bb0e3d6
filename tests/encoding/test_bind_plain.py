"""An effect's call is bound without ``inspect`` where its parameters are plain: to the same
mapping, in the same order, as ``Signature.bind`` with defaults applied, so that its
argument hash (the key of exactly-once) and what is shown are those ``inspect`` gave."""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import kernelext as kx
from kernelext._core.encoding.effect_args import bind_plain
from kernelext._core.encoding.keys import bound_hash, display_args

P = inspect.Parameter
_NAMES = ["a", "b", "c", "d", "e", "idempotency_key"]
_VALUES = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers()))


@st.composite
def _calls(draw: st.DrawFn) -> tuple[inspect.Signature, tuple[Any, ...], dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=5))
    kinds = [
        draw(st.sampled_from([P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY, P.POSITIONAL_ONLY]))
        for _ in names
    ]
    kinds.sort(key=lambda k: [P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY].index(k))
    params: list[inspect.Parameter] = []
    defaulted = False
    for name, kind in zip(names, kinds, strict=True):
        has_default = draw(st.booleans()) or (defaulted and kind is not P.KEYWORD_ONLY)
        defaulted = defaulted or (has_default and kind is not P.KEYWORD_ONLY)
        default = draw(_VALUES) if has_default else P.empty
        params.append(P(name, kind, default=default))
    signature = inspect.Signature(params)
    args = tuple(draw(st.lists(_VALUES, max_size=3)))
    keywords = draw(st.lists(st.sampled_from([*_NAMES, "zz"]), unique=True, max_size=5))
    kwargs = {name: draw(_VALUES) for name in keywords}
    return signature, args, kwargs


@settings(max_examples=500, deadline=None)
@given(call=_calls())
def test_a_plain_signature_binds_as_inspect_binds(
    call: tuple[inspect.Signature, tuple[Any, ...], dict[str, Any]],
) -> None:
    signature, args, kwargs = call
    fast = bind_plain(signature, args, kwargs)
    try:
        ba = signature.bind(*args, **kwargs)
    except TypeError:
        assert fast is None  # inspect refuses it: it is inspect that says why
        return
    ba.apply_defaults()
    plain = all(p.kind is not P.POSITIONAL_ONLY for p in signature.parameters.values())
    if not plain:
        assert fast is None
        return
    assert fast is not None
    assert list(fast.items()) == list(ba.arguments.items())  # same values, same order
    assert all(fast[k] is ba.arguments[k] for k in fast)  # the very objects (defaults too)
    assert bound_hash(fast) == bound_hash(dict(ba.arguments))
    assert display_args(fast) == display_args(dict(ba.arguments))


def test_an_effect_binds_its_calls_without_inspect(monkeypatch: Any) -> None:
    @kx.effect
    def pay(to: str, amount: int = 10, *, note: str = "", idempotency_key: str = "") -> None:
        return None

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("inspect.Signature.bind was called")

    assert pay.signature is not None
    monkeypatch.setattr(type(pay.signature), "bind", refuse)
    assert pay._bound(("bob",), {"note": "n"}) == {"to": "bob", "amount": 10, "note": "n"}
    assert list(pay._bound(("bob", 3), {})) == ["to", "amount", "note"]


def test_arguments_that_do_not_fit_are_left_to_inspect() -> None:
    @kx.effect
    def pay(to: str, amount: int = 10) -> None:
        return None

    assert pay._bound((), {"amount": 1}) is None  # "to" missing
    assert pay._bound(("a", 1, 2), {}) is None
    assert pay._bound(("a",), {"to": "b"}) is None
    assert pay._bound(("a",), {"cost": 1}) is None
