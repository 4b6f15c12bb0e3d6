"""The name a class is hashed and shown by: its module and qualified name, kept across moves.

An argument hash (``canonical.digest``) includes the name of a dataclass's, an enum's, a
NamedTuple's or a pydantic model's class, so that equal fields of different types differ.
A run recorded before kernelext's own modules moved hashed its types under their former
module; keeping that name keeps its recorded calls matching on resume. A class of a module
moved later adds its former module here, and ``tests/contracts/test_type_names.py`` pins them all.
"""

from __future__ import annotations

# where each engine module with an encodable class was before the engine's packages
FORMER_MODULES: dict[str, str] = {
    "kernelext._core.batch.view": "kernelext._core.batch_view",
    "kernelext._core.batch.wire": "kernelext._core.remote_wire",
    "kernelext._core.encoding.data_args": "kernelext._core.data_args",
    "kernelext._core.engine.snapshot": "kernelext._core.snapshot",
    "kernelext._core.engine.stop_estimate": "kernelext._core.stop_estimate",
    "kernelext._core.ledger.evidence": "kernelext._core.evidence",
    "kernelext._core.ledger.failures": "kernelext._core.failures",
    "kernelext._core.ledger.probes": "kernelext._core.probes",
    "kernelext._core.lifecycle.cell_runs": "kernelext._core.cell_runs",
    "kernelext._core.lifecycle.expiry": "kernelext._core.expiry",
    "kernelext._core.lifecycle.overview": "kernelext._core.overview",
    "kernelext._core.lifecycle.takeover": "kernelext._core.takeover",
    "kernelext._core.plan.items": "kernelext._core.plan_items",
    "kernelext._core.plan.resume_plan": "kernelext._core.plan",
    "kernelext._core.process.checks": "kernelext._core.checks",
    "kernelext._core.views.conversation": "kernelext._core.conversation",
    "kernelext._core.views.timeline": "kernelext._core.timeline",
    "kernelext._core.views.timeline_fold": "kernelext._core.timeline_fold",
    "kernelext._core.views.timeline_svg": "kernelext._core.timeline_svg",
}


def type_name(cls: type) -> str:
    module = cls.__module__
    return f"{FORMER_MODULES.get(module, module)}.{cls.__qualname__}"
