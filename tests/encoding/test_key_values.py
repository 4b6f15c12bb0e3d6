"""The keys and argument hashes that identify calls for exactly-once keep their values: a
resumed run recorded by an earlier release finds its calls under the same keys (values
computed by the release before these were made cheaper)."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import kernelext as kx
from kernelext._core.encoding.keys import _effect_key, args_hash, bound_hash, effect_key

KEYS = [
    (("run-1", "step-a", "send", 0), "9f506c74-8333-68db-f8a5-8a9b25c75a06"),
    (("run-1", "step-a", "send", 3, 1), "ec59e074-a7ac-8144-63bf-184f845eb6ed"),
    (
        ("bench_batch_ping-7b614c2e", "17", "batch_ping", -5, 2),
        "21a21107-0791-4d39-bf8e-db32d902a960",
    ),
]


def test_effect_keys_keep_their_values_cached_or_not() -> None:
    for parts, expected in KEYS:
        assert str(effect_key(*parts)) == expected  # type: ignore[arg-type]
        assert str(effect_key(*parts)) == expected  # type: ignore[arg-type]  # a second time
        assert str(_effect_key(*parts)) == expected  # type: ignore[arg-type]  # never kept
    assert isinstance(effect_key("r", "s", "t", 0), uuid.UUID)
    # True is not the ordinal 1 (scheme 1 writes "True"): whichever comes first, each keeps its own
    ordinal_true = effect_key("r", "s", "t", True, 1)
    assert effect_key("r", "s", "t", 1, 1) != ordinal_true == _effect_key("r", "s", "t", True, 1)


def test_argument_hashes_keep_their_values() -> None:
    assert (
        bound_hash({"to": "bob", "amount": 10, "note": ""})
        == "26e2a6caf45dd76fb2309f6401036d2e9776a16f353c051033671a129f1dfff3"
    )
    assert bound_hash({"i": 5}) == (
        "5489fa966c21ae99db70b286d44b2a347fff45a2390ff9e3cce07578a49b8d47"
    )
    assert args_hash(("bob", decimal.Decimal("1.50")), {"at": dt.date(2026, 1, 2)}, 2) == (
        "72e821e254f4c9dc4864a8f8b5216d8db02148e5d215b0d30dc855f6796337c5"
    )
    assert args_hash(("bob", 3), {"x": [1, 2]}, 1) == "53c28710b5aa76e004778a7d8e525a8d"


def test_a_call_bound_without_inspect_hashes_as_before() -> None:
    @kx.effect
    def pay(to: str, amount: int = 10, *, note: str = "", idempotency_key: str = "") -> None:
        return None

    for args, kwargs in [(("bob",), {}), (("bob", 10), {}), ((), {"to": "bob", "note": ""})]:
        bound = pay._bound(args, kwargs)
        assert bound is not None
        assert bound_hash(bound) == (
            "26e2a6caf45dd76fb2309f6401036d2e9776a16f353c051033671a129f1dfff3"
        )
