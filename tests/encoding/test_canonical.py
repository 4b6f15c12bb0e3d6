"""The canonical encoding (issue 19 items 2, 5, 7): argument hashes bound by value,
injective keys, results that round-trip.

Property tests (hypothesis): equal values give equal hashes and distinct values distinct
ones, judged by an oracle written independently of the encoder, also across processes
(another PYTHONHASHSEED: set and dict order must not leak in); effect keys are injective
over valid run ids, step keys and tool names, and the framing is prefix-free.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import os
import pathlib
import pickle
import subprocess
import sys
import uuid
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelext._core.encoding.canonical import MAX_DEPTH, Unencodable, canonical, digest, frame
from kernelext._core.encoding.keys import (
    args_hash,
    call_place,
    call_text,
    effect_key,
    question_key,
    repeated_call,
    stored_result,
)
from kernelext._core.encoding.tagged import tagged, untag
from kernelext.errors import LedgerError, UnencodableArgument


class Colour(enum.Enum):
    RED = 1
    ONE = "1"


@dataclasses.dataclass(frozen=True)
class Point:
    x: Any
    y: Any


class Model(pydantic.BaseModel):
    a: int
    b: str


# -- strategies ----------------------------------------------------------------------------
UTC_OFFSETS = st.sampled_from(
    [None, dt.timezone.utc, dt.timezone(dt.timedelta(hours=1)), dt.timezone(-dt.timedelta(hours=5))]
)
text = st.text(max_size=8)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
    st.decimals(allow_nan=True, allow_infinity=True, places=None),
    st.binary(max_size=8),
    st.builds(bytearray, st.binary(max_size=4)),
    st.datetimes(timezones=UTC_OFFSETS),
    st.dates(),
    st.times(),
    st.timedeltas(),
    st.uuids(),
    st.builds(pathlib.PurePosixPath, text),
    st.sampled_from(list(Colour)),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(Model, a=st.integers(), b=text),
)
hashable = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), text, st.decimals(allow_nan=False)),
    lambda inner: st.one_of(st.tuples(inner, inner), st.frozensets(inner, max_size=3)),
    max_leaves=6,
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(hashable, inner, max_size=3),
        st.sets(hashable, max_size=3),
        st.frozensets(hashable, max_size=3),
        st.builds(Point, inner, inner),
    ),
    max_leaves=12,
)


def oracle(v: Any) -> Any:
    """What "the same value" means, written without the encoder: type-strict equality,
    NaN equal to NaN, aware datetimes with their offset (see
    kernelext/_core/encoding/canonical.py)."""
    if isinstance(v, enum.Enum):
        return ("enum", type(v).__qualname__, oracle(v.value))
    if isinstance(v, np.generic):
        return ("np", v.dtype.str, v.tobytes())
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else v + 0.0)
    if isinstance(v, Decimal):
        return ("dec", "nan" if v.is_nan() else v, v.is_snan())
    if isinstance(v, (bytes, bytearray)):
        return ("bytes", bytes(v))
    if isinstance(v, dt.datetime):
        return ("datetime", v.replace(tzinfo=None), v.utcoffset())
    if isinstance(v, (dt.date, dt.time, dt.timedelta, uuid.UUID, str)) or v is None:
        return (type(v).__name__, v)
    if isinstance(v, pathlib.PurePath):
        return ("path", str(v))
    if isinstance(v, list):
        return ("list", tuple(oracle(x) for x in v))
    if isinstance(v, tuple):
        return ("tuple", tuple(oracle(x) for x in v))
    if isinstance(v, dict):
        return ("dict", frozenset((oracle(k), oracle(x)) for k, x in v.items()))
    if isinstance(v, (set, frozenset)):
        return ("set", frozenset(oracle(x) for x in v))
    if isinstance(v, Point):
        return ("Point", oracle(v.x), oracle(v.y))
    if isinstance(v, Model):
        return ("Model", v.a, v.b)
    raise AssertionError(f"no oracle for {type(v)}")


# -- properties ----------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(values, values)
def test_equal_values_equal_hashes_distinct_values_distinct_hashes(a: Any, b: Any) -> None:
    assert (oracle(a) == oracle(b)) == (digest(a) == digest(b))
    assert digest(a) == digest(pickle.loads(pickle.dumps(a)))  # a copy: the same hash


@settings(max_examples=4, deadline=None)
@given(st.lists(values, min_size=40, max_size=40))
def test_hashes_are_the_same_in_another_process(batch: list[Any]) -> None:
    here = [digest(v) for v in batch]
    code = (
        "import pickle, sys\n"
        "from kernelext._core.encoding.canonical import digest\n"
        "batch = pickle.loads(sys.stdin.buffer.read())\n"
        "sys.stdout.write('\\n'.join(digest(v) for v in batch))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": str(1 + len(batch) + os.getpid() % 1000)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(batch),
        capture_output=True,
        env={**env, "PYTHONPATH": os.path.dirname(__file__)},
        check=True,
        timeout=60,
    ).stdout.decode()
    assert out.split("\n") == here


valid_name = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"),
    min_size=1,
    max_size=12,
).filter(str.strip)


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(valid_name, valid_name, valid_name, st.integers(0, 3)),
    st.tuples(valid_name, valid_name, valid_name, st.integers(0, 3)),
)
def test_effect_keys_are_injective_and_the_framing_prefix_free(a: Any, b: Any) -> None:
    assert (a == b) == (effect_key(*a) == effect_key(*b))
    assert (a[:2] + a[3:] == b[:2] + b[3:]) == (
        question_key(a[0], a[1], a[3]) == question_key(b[0], b[1], b[3])
    )
    if a != b:
        assert not frame(*b).startswith(frame(*a))


def test_nul_joined_parts_no_longer_share_a_key() -> None:
    assert effect_key("a\0b", "c", "t", 0) != effect_key("a", "b\0c", "t", 0)
    assert effect_key("a\0b", "c", "t", 0, scheme=1) == effect_key("a", "b\0c", "t", 0, scheme=1)


@settings(max_examples=500, deadline=None)
@given(
    st.integers(0, 70_000), st.integers(0, 70_000), st.integers(0, 70_000), st.integers(0, 70_000)
)
def test_calls_at_a_site_are_numbered_injectively_apart_from_every_site(
    site: int, earlier: int, other: int, other_earlier: int
) -> None:
    """The n-th call of an effect at a site (a framework's tool call) has an ordinal of its
    own: the first has the site's ordinal, later ones are negative (no site's), none
    shared, each read back as (site, n), and the stores' 32-bit column holds them."""
    try:
        code = repeated_call(site, earlier)
        again = repeated_call(other, other_earlier)
    except LedgerError:
        assert site + earlier > 65_000 or other + other_earlier > 65_000
        return
    assert (code == again) == ((site, earlier) == (other, other_earlier))
    assert call_place(code) == (site, earlier)
    assert (code == site) if earlier == 0 else (-(2**31) <= code < 0)


def test_a_repeated_call_reads_as_its_site_and_count() -> None:
    grid = {(site, n): repeated_call(site, n) for site in range(200) for n in range(200)}
    assert len(set(grid.values())) == len(grid)
    assert all(call_place(code) == place for place, code in grid.items())
    assert [repeated_call(3, n) for n in range(4)] == [3, -7, -12, -18]
    assert [call_text(repeated_call(1, n)) for n in (0, 1, 2, 10, 21)] == [
        "1", "1 (2nd)", "1 (3rd)", "1 (11th)", "1 (22nd)"
    ]  # fmt: skip
    assert repeated_call(1, 65_000) > -(2**31)
    with pytest.raises(LedgerError, match="Pass many items to one call"):
        repeated_call(1, 70_000)
    with pytest.raises(ValueError):
        repeated_call(-1, 1)
    assert effect_key("r", "turn 1", "note", -7) != effect_key("r", "turn 1", "note", 7)


# -- attacks -------------------------------------------------------------------------------
def test_types_that_compare_equal_in_python_are_still_different_arguments() -> None:
    same_number = [1, 1.0, True, "1", Decimal(1), np.int64(1), np.float64(1.0), Colour.RED]
    assert len({digest(v) for v in same_number}) == len(same_number)
    assert digest([1, 2]) != digest((1, 2))
    assert digest(b"ab") == digest(bytearray(b"ab")) == digest(memoryview(b"ab"))
    assert digest({1, 2}) == digest(frozenset({2, 1}))
    assert digest("") != digest(b"") != digest(None) != digest([])


def test_equal_values_of_one_type_hash_equal() -> None:
    assert digest(Decimal("1.0")) == digest(Decimal("1.00")) == digest(Decimal("1"))
    assert digest(Decimal("-0")) == digest(Decimal("0.000"))
    assert digest(Decimal("1.5")) != digest(Decimal("15"))
    long = Decimal("1." + "1" * 60)  # longer than the context's 28 digits: not rounded
    assert digest(long) != digest(long + Decimal("1e-60"))
    assert digest(0.0) == digest(-0.0) and digest(math.nan) == digest(-math.nan)
    assert digest(math.inf) != digest(-math.inf) != digest(1e308)
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})


def test_datetimes_keep_their_zone_and_naive_is_not_aware() -> None:
    utc = dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc)
    paris = utc.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert utc == paris and digest(utc) != digest(paris)  # documented: the zone is shown
    assert digest(utc.replace(tzinfo=None)) != digest(utc)
    assert digest(dt.date(2026, 1, 1)) != digest(dt.datetime(2026, 1, 1))


def test_tagged_data_and_user_data_that_looks_like_a_tag_never_collide() -> None:
    fake = {"$kx": "decimal", "v": "10"}
    assert digest(fake) != digest(Decimal("10"))
    assert untag(tagged(fake, result=True)) == fake
    assert untag(tagged(Decimal("10"), result=True)) == Decimal("10")
    # the canonical bytes of a str that spells another value's encoding
    assert digest(canonical(1).decode("latin-1")) != digest(1)
    assert digest(["a", "b"]) != digest(["ab"]) != digest(["a", ["b"]])
    assert args_hash(("a", "b"), {}) != args_hash(("a",), {"b": "b"})


def test_numpy_pandas_arrow_are_bound_by_dtype_shape_and_data() -> None:
    assert digest(np.array([1, 2], dtype=np.int64)) != digest(np.array([1, 2], dtype=np.int32))
    assert digest(np.zeros((2, 3))) != digest(np.zeros((3, 2)))
    assert digest(np.arange(6)[::2]) == digest(np.array([0, 2, 4]))  # layout does not count
    frame_a = pd.DataFrame({"a": [1, 2]})
    assert digest(frame_a) == digest(pd.DataFrame({"a": [1, 2]}))
    assert digest(frame_a) != digest(pd.DataFrame({"a": [1, 3]}))
    assert digest(frame_a["a"]) != digest(frame_a)
    chunked = pa.concat_tables([pa.table({"a": [1]}), pa.table({"a": [2]})])
    assert digest(chunked) == digest(pa.table({"a": [1, 2]}))  # chunking does not count
    assert digest(pd.Timestamp("2026-01-01", tz="UTC")) != digest(pd.Timestamp("2026-01-01"))
    assert digest(pd.NA) != digest(None) != digest(pd.NaT)


def test_huge_ints_and_deep_nesting() -> None:
    big = 10**5000  # past int('...') 4300-digit limit
    assert digest(big) != digest(big + 1)
    assert untag(tagged(big, result=True)) == big
    deep: Any = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(Unencodable, match="nested more than"):
        digest(deep)
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(Unencodable, match="nested more than"):
        digest(cycle)


def test_what_cannot_be_encoded_is_refused_naming_the_argument() -> None:
    with open(os.devnull) as handle:
        for bad in (object(), lambda: 1, handle):
            with pytest.raises(UnencodableArgument) as caught:
                args_hash(("bob", {"nested": [bad]}), {}, tool="pay", names=("to", "amount"))
            message = str(caught.value)
            assert "pay" in message and "amount['nested'][0]" in message
            assert type(bad).__name__ in message and "Pass plain values" in message


def test_results_round_trip_and_plain_json_stays_plain() -> None:
    value = {
        "at": dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc),
        "amount": Decimal("10.50"),
        "raw": b"\x00\xff",
        "pair": (1, "a"),
        "tags": {"x", "y"},
        "frozen": frozenset({1}),
        "ids": {1: "one", (2, 3): "two-three"},
        "nan": math.nan,
        "day": dt.date(2026, 1, 2),
        "uid": uuid.UUID(int=5),
        "surrogate": "caf\udce9",
    }
    back = untag(__import__("json").loads(stored_result(value)))
    assert math.isnan(back.pop("nan")) and math.isnan(value.pop("nan"))
    assert back == value
    assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in value.items()}
    plain = {"usage": {"total_tokens": 7}, "choices": [{"text": "hi"}]}
    assert stored_result(plain) == '{"usage":{"total_tokens":7},"choices":[{"text":"hi"}]}'
    for bad in (object(), Point(1, 2), Colour.RED, np.zeros(2)):
        with pytest.raises(Unencodable):
            stored_result({"x": bad})


def test_results_are_scrubbed_of_secrets() -> None:
    import kernelext as kx

    kx.secrets.register("s3cr3t-value-42")
    stored = stored_result(
        {
            "api_key": "k",
            "token": "Hello",
            "note": ("see s3cr3t-value-42",),
            "b": b"s3cr3t-value-42",
        }
    )
    assert "s3cr3t" not in stored and "Hello" in stored
    back = untag(__import__("json").loads(stored))
    assert back["api_key"] == "k"  # no name guessed: a resume returns what the run computed
    assert back["note"] == ("see ***",)
    assert back["b"] == b"***"


def test_a_scheme_1_run_binds_new_calls_by_value_and_still_accepts_what_it_accepted() -> None:
    from kernelext._core.encoding.keys import call_hashes, hash_for

    new, old = call_hashes(("bob", Decimal("10")), {}, 1, tool="pay")
    assert len(new) == 64 and old is not None and len(old) == 32
    assert old == call_hashes(("bob", Decimal("9999999")), {}, 1, tool="pay")[1]  # weak
    assert new != call_hashes(("bob", Decimal("9999999")), {}, 1, tool="pay")[0]  # by value
    assert hash_for(old, new, old) == old and hash_for(new, new, old) == new
    fallback, old2 = call_hashes(("bob", object()), {}, 1, tool="pay")
    assert fallback == old2 and len(fallback) == 32  # an earlier release accepted it
    with pytest.raises(UnencodableArgument):
        call_hashes(("bob", object()), {}, 2, tool="pay")
    assert call_hashes(("bob",), {}, 2, tool="pay")[1] is None


# -- exact types only: subclasses of builtins are refused (B3) ------------------------------
class LiarInt(int):
    def __int__(self) -> int:
        return 10

    def __index__(self) -> int:
        return 10


class TaggedStr(str):
    pass


class LiarDecimal(Decimal):
    pass


class LiarDict(dict):  # type: ignore[type-arg]
    pass


class LiarList(list):  # type: ignore[type-arg]
    pass


def test_subclasses_of_builtins_are_refused_not_read_through_their_dunders() -> None:
    tagged_str = TaggedStr("bob")
    tagged_str.extra = "mallory"  # type: ignore[attr-defined]
    import collections

    for bad in (
        LiarInt(1000000),
        tagged_str,
        LiarDecimal("1"),
        LiarDict(a=1),
        LiarList([1]),
        collections.defaultdict(int, a=1),
        type("F", (float,), {})(1.5),
        type("T", (tuple,), {})((1,)),
        type("S", (frozenset,), {})({1}),
    ):
        with pytest.raises(Unencodable, match="subclass of"):
            canonical(bad)
        with pytest.raises(Unencodable, match="subclass of"):
            tagged(bad)
        with pytest.raises(UnencodableArgument, match="subclass of"):
            args_hash(("bob", bad), {}, tool="pay", names=("to", "amount"))
    assert canonical(True) != canonical(1) and canonical(Flag.ON) != canonical(1)
    # A result that subclasses a builtin is stored as the builtin value its base slot holds.
    assert untag(tagged(LiarInt(1000000), result=True)) == 1000000


class Flag(enum.IntEnum):
    ON = 1


def test_namedtuple_and_ordered_dict_are_encoded_deliberately() -> None:
    import collections
    from typing import NamedTuple

    class P(NamedTuple):
        to: str
        amount: int

    Q = collections.namedtuple("Q", "to amount")
    assert digest(P("bob", 10)) != digest(("bob", 10)) != digest(Q("bob", 10))
    assert digest(P("bob", 10)) != digest(P("bob", 11))
    assert tagged(P("bob", 10))["v"] == {"to": "bob", "amount": 10}
    od = collections.OrderedDict
    assert digest(od(a=1, b=2)) != digest(od(b=2, a=1)) != digest({"a": 1, "b": 2})
    assert digest(od(a=1)) == digest(od(a=1))


# -- pydantic: raw values, never the model's serializers (B4) -------------------------------
def test_pydantic_models_are_bound_by_raw_values_not_model_dump() -> None:
    class Excluded(pydantic.BaseModel):
        to: str
        amount: int = pydantic.Field(exclude=True)

    class Rounded(pydantic.BaseModel):
        amount: float

        @pydantic.field_serializer("amount")
        def _round(self, v: float) -> float:
            return round(v)

    class Custom(pydantic.BaseModel):
        amount: int

        @pydantic.model_serializer
        def _dump(self) -> dict[str, Any]:
            return {"amount": 10}

    class Private(pydantic.BaseModel):
        to: str
        _route: str = pydantic.PrivateAttr(default="a")

    class Extra(pydantic.BaseModel, extra="allow"):
        to: str

    assert digest(Excluded(to="b", amount=10)) != digest(Excluded(to="b", amount=1000000))
    assert tagged(Excluded(to="b", amount=1000000))["v"]["amount"] == 1000000
    assert digest(Rounded(amount=10.0)) != digest(Rounded(amount=10.4))
    assert tagged(Rounded(amount=10.4))["v"]["amount"] == 10.4
    assert digest(Custom(amount=10)) != digest(Custom(amount=1000000))
    assert tagged(Custom(amount=1000000))["v"] == {"amount": 1000000}
    a, b = Private(to="x"), Private(to="x")
    b._route = "b"
    assert digest(a) != digest(b) and tagged(b)["private"] == {"_route": "b"}
    assert digest(Extra(to="x", amount=1)) != digest(Extra(to="x", amount=2))
    assert tagged(Extra(to="x", amount=2))["extra"] == {"amount": 2}


# -- numpy subclasses, dataclass attributes, aware times (B6, B8c) --------------------------
def test_masked_arrays_matrices_and_dataclass_extra_attributes_are_refused() -> None:
    masked = np.ma.MaskedArray([10, 1000000], mask=[False, True])
    with pytest.warns(PendingDeprecationWarning):
        matrix = np.matrix([[1, 2]])
    for bad in (masked, matrix):
        with pytest.raises(Unencodable, match="ndarray subclass"):
            canonical(bad)

    @dataclasses.dataclass
    class Order:
        to: str

    order = Order("bob")
    order.amount = 1000000  # type: ignore[attr-defined]
    with pytest.raises(Unencodable, match="not fields"):
        canonical(order)
    with pytest.raises(Unencodable, match="not fields"):
        tagged(order)
    assert digest(Order("bob")) == digest(Order("bob"))


def test_an_aware_time_binds_and_shows_its_zone() -> None:
    from zoneinfo import ZoneInfo

    paris = dt.time(9, tzinfo=ZoneInfo("Europe/Paris"))
    tokyo = dt.time(9, tzinfo=ZoneInfo("Asia/Tokyo"))
    assert digest(paris) != digest(tokyo) != digest(dt.time(9))
    assert tagged(paris) == {"$kx": "time", "v": "09:00:00", "zone": "Europe/Paris"}
    fixed = dt.time(9, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert tagged(fixed)["zone"] == "2:00:00" and untag(tagged(fixed, result=True)) == fixed
