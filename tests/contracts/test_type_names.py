"""A class's hashed name stays as it was when its module moves: recorded calls keep matching.

Every engine class the argument hash names (dataclasses, enums, NamedTuples) is listed here
with the name runs recorded before kernelext's packages hashed it under. A class that moves
adds its former module to ``kernelext/_core/encoding/type_names.py``; a new class is added here.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import pickle
import pkgutil

import kernelext._core
from kernelext._core.encoding.canonical import canonical
from kernelext._core.encoding.codec import decode
from kernelext._core.encoding.keys import args_hash, display_args
from kernelext._core.encoding.type_names import FORMER_MODULES, type_name

PINNED = {
    "kernelext._core.batch_view.BatchCounts",
    "kernelext._core.batch_view.StoredBatch",
    "kernelext._core.cell_runs.StepOutcome",
    "kernelext._core.checks.Outcome",
    "kernelext._core.conversation.Conversation",
    "kernelext._core.data_args.DataArgument",
    "kernelext._core.data_args.DataDiff",
    "kernelext._core.evidence.Evidence",
    "kernelext._core.expiry.ExpiredRun",
    "kernelext._core.expiry.SweepResult",
    "kernelext._core.failures.Failure",
    "kernelext._core.overview.Overview",
    "kernelext._core.overview.RunRow",
    "kernelext._core.plan.ResumePlan",
    "kernelext._core.plan_items.ClaimItem",
    "kernelext._core.plan_items.CodeChange",
    "kernelext._core.plan_items.CredentialItem",
    "kernelext._core.plan_items.EffectItem",
    "kernelext._core.plan_items.FactItem",
    "kernelext._core.plan_items.NextStep",
    "kernelext._core.plan_items.PlanData",
    "kernelext._core.plan_items.RequestItem",
    "kernelext._core.plan_items.StepItem",
    "kernelext._core.probes.Settled",
    "kernelext._core.remote_wire.RemoteOutcome",
    "kernelext._core.remote_wire.RemoteTask",
    "kernelext._core.snapshot._Entry",
    "kernelext._core.stop_estimate.StopEstimate",
    "kernelext._core.takeover.TakeOver",
    "kernelext._core.timeline.Bar",
    "kernelext._core.timeline.EffectTick",
    "kernelext._core.timeline.Gap",
    "kernelext._core.timeline.Mark",
    "kernelext._core.timeline.Span",
    "kernelext._core.timeline.Timeline",
    "kernelext._core.timeline_fold._Column",
    "kernelext._core.timeline_svg._Layout",
}


def _encodable_engine_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(kernelext._core.__path__, "kernelext._core."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if not inspect.isclass(value) or value.__module__ != info.name:
                continue
            named = dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)
            if named or (issubclass(value, tuple) and hasattr(value, "_fields")):
                found[type_name(value)] = value
    return found


def test_every_hashed_engine_class_keeps_its_pinned_name() -> None:
    found = _encodable_engine_classes()
    assert set(found) == PINNED, (
        f"new: {sorted(set(found) - PINNED)}; lost: {sorted(PINNED - set(found))}. A moved "
        "class adds its former module to kernelext/_core/encoding/type_names.py"
    )


def test_every_engine_module_names_its_former_home() -> None:
    now = {
        info.name
        for info in pkgutil.walk_packages(kernelext._core.__path__, "kernelext._core.")
        if not info.ispkg and info.name != "kernelext._core.encoding.type_names"  # new
    }
    assert set(FORMER_MODULES) == now, "a module moved: add its former name to FORMER_MODULES"
    homes = {cls.__module__ for cls in _encodable_engine_classes().values()}
    assert homes <= set(FORMER_MODULES)


def test_a_scheme_1_hash_names_a_moved_class_by_its_former_module() -> None:
    """A scheme-1 run's hash names an argument JSON has no type for by its class (an effect,
    a handle, a run): as the release that recorded it named it."""
    import kernelext as kx

    def pay(to: str) -> str:
        return to

    wrapped = kx.effect(pay)
    assert display_args({"x": wrapped}, 1) == '{"x": "<kernelext._core.ledger.Effect>"}'
    assert args_hash((wrapped,), {}, 1) == "3c3e8e579fa2cc8566c338bc12ab7319"


def test_a_state_value_pickled_before_the_move_loads() -> None:
    """``pickle=True`` state that holds a kernelext value (a plan, a timeline) names the
    class's module of the release that stored it."""
    from kernelext._core.ledger.evidence import Evidence

    value = Evidence(**{f.name: None for f in dataclasses.fields(Evidence)})
    stored = pickle.dumps(value, protocol=0).replace(
        b"kernelext._core.ledger.evidence\n", b"kernelext._core.evidence\n"
    )
    assert b"kernelext._core.evidence\n" in stored
    assert decode("pickle", stored, allow_pickle=True) == value


def test_an_engine_dataclass_in_an_argument_hashes_under_its_former_name() -> None:
    from kernelext._core.ledger.evidence import Evidence

    fields = {f.name: None for f in dataclasses.fields(Evidence)}
    encoded = canonical(Evidence(**fields))
    assert b"kernelext._core.evidence.Evidence" in encoded
    assert b"kernelext._core.ledger.evidence" not in encoded
