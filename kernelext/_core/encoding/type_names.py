"""The name a class is hashed and shown by: its module and qualified name, kept across moves.

An argument hash (``canonical.digest``) includes the name of a dataclass's, an enum's, a
NamedTuple's or a pydantic model's class, so that equal fields of different types differ.
A run recorded before kernelext's own modules moved hashed its types under their former
module; keeping that name keeps its recorded calls matching on resume (the scheme-1 hash names
the class of any argument JSON has no type for, ``keys._args_hash_v1``), and a pickled state
value names its class's module too (``codec.decode`` finds it where it is now). A module moved
later adds its former name here, and ``tests/contracts/test_type_names.py`` pins them all.
"""

from __future__ import annotations

# where each engine module was before the engine's packages (every one of them: a class
# of any of them may be hashed, shown or pickled under its former name)
FORMER_MODULES: dict[str, str] = {
    "kernelext._core.batch.core": "kernelext._core.batch",
    "kernelext._core.batch.heartbeat": "kernelext._core.remote_heartbeat",
    "kernelext._core.batch.items": "kernelext._core.batch_items",
    "kernelext._core.batch.remote": "kernelext._core.batch_remote",
    "kernelext._core.batch.remote_ended": "kernelext._core.remote_ended",
    "kernelext._core.batch.remote_item": "kernelext._core.remote_item",
    "kernelext._core.batch.source": "kernelext._core.batch_source",
    "kernelext._core.batch.tasks": "kernelext._core.batch_async",
    "kernelext._core.batch.threads": "kernelext._core.batch_threads",
    "kernelext._core.batch.view": "kernelext._core.batch_view",
    "kernelext._core.batch.wire": "kernelext._core.remote_wire",
    "kernelext._core.encoding.canonical": "kernelext._core.canonical",
    "kernelext._core.encoding.codec": "kernelext._core.codec",
    "kernelext._core.encoding.data_args": "kernelext._core.data_args",
    "kernelext._core.encoding.effect_args": "kernelext._core.effect_args",
    "kernelext._core.encoding.keys": "kernelext._core.keys",
    "kernelext._core.encoding.names": "kernelext._core.names",
    "kernelext._core.encoding.secret_forms": "kernelext._core.secret_forms",
    "kernelext._core.encoding.secrets": "kernelext._core.secrets",
    "kernelext._core.encoding.tagged": "kernelext._core.tagged",
    "kernelext._core.engine.claims": "kernelext._core.claims",
    "kernelext._core.engine.context": "kernelext._core.context",
    "kernelext._core.engine.forced_stop": "kernelext._core.forced_stop",
    "kernelext._core.engine.groups": "kernelext._core.groups",
    "kernelext._core.engine.posted_stops": "kernelext._core.posted_stops",
    "kernelext._core.engine.run_engine": "kernelext._core.run_engine",
    "kernelext._core.engine.snapshot": "kernelext._core.snapshot",
    "kernelext._core.engine.step_info": "kernelext._core.step_info",
    "kernelext._core.engine.step_skip": "kernelext._core.step_skip",
    "kernelext._core.engine.stop_estimate": "kernelext._core.stop_estimate",
    "kernelext._core.facts.credentials": "kernelext._core.credentials",
    "kernelext._core.facts.facts": "kernelext._core.facts",
    "kernelext._core.ledger.effect": "kernelext._core.ledger",
    "kernelext._core.ledger.effect_approval": "kernelext._core.effect_approval",
    "kernelext._core.ledger.effect_async": "kernelext._core.ledger_async",
    "kernelext._core.ledger.effect_outcomes": "kernelext._core.effect_outcomes",
    "kernelext._core.ledger.evidence": "kernelext._core.evidence",
    "kernelext._core.ledger.failures": "kernelext._core.failures",
    "kernelext._core.ledger.limits": "kernelext._core.limits",
    "kernelext._core.ledger.probes": "kernelext._core.probes",
    "kernelext._core.ledger.retries": "kernelext._core.retries",
    "kernelext._core.lifecycle.agent": "kernelext._core.agent",
    "kernelext._core.lifecycle.cell_runs": "kernelext._core.cell_runs",
    "kernelext._core.lifecycle.control": "kernelext._core.control",
    "kernelext._core.lifecycle.expiry": "kernelext._core.expiry",
    "kernelext._core.lifecycle.from_elsewhere": "kernelext._core.from_elsewhere",
    "kernelext._core.lifecycle.handle": "kernelext._core.handle",
    "kernelext._core.lifecycle.overview": "kernelext._core.overview",
    "kernelext._core.lifecycle.reattach": "kernelext._core.reattach",
    "kernelext._core.lifecycle.restart": "kernelext._core.restart",
    "kernelext._core.lifecycle.resume": "kernelext._core.resume",
    "kernelext._core.lifecycle.resume_steps": "kernelext._core.resume_steps",
    "kernelext._core.lifecycle.revalidation": "kernelext._core.revalidation",
    "kernelext._core.lifecycle.run": "kernelext._core.run",
    "kernelext._core.lifecycle.starting": "kernelext._core.starting",
    "kernelext._core.lifecycle.stop_answer": "kernelext._core.stop_answer",
    "kernelext._core.lifecycle.takeover": "kernelext._core.takeover",
    "kernelext._core.lifecycle.worker": "kernelext._core.worker",
    "kernelext._core.people.approval_extras": "kernelext._core.approval_extras",
    "kernelext._core.people.approvals": "kernelext._core.approvals",
    "kernelext._core.people.asking": "kernelext._core.asking",
    "kernelext._core.people.decide_elsewhere": "kernelext._core.decide_elsewhere",
    "kernelext._core.people.questions": "kernelext._core.questions",
    "kernelext._core.people.reconcile": "kernelext._core.reconcile",
    "kernelext._core.people.waiting": "kernelext._core.waiting",
    "kernelext._core.plan.code": "kernelext._core.plan_code",
    "kernelext._core.plan.items": "kernelext._core.plan_items",
    "kernelext._core.plan.render": "kernelext._core.plan_render",
    "kernelext._core.plan.resume_plan": "kernelext._core.plan",
    "kernelext._core.plan.rules": "kernelext._core.plan_rules",
    "kernelext._core.process.api": "kernelext._core.api",
    "kernelext._core.process.checks": "kernelext._core.checks",
    "kernelext._core.process.click_stores": "kernelext._core.click_stores",
    "kernelext._core.process.current": "kernelext._core.current",
    "kernelext._core.process.lease": "kernelext._core.lease",
    "kernelext._core.process.options": "kernelext._core.options",
    "kernelext._core.process.registries": "kernelext._core.registries",
    "kernelext._core.process.runs_frame": "kernelext._core.runs_frame",
    "kernelext._core.process.runtime": "kernelext._core.runtime",
    "kernelext._core.process.shown_stores": "kernelext._core.shown_stores",
    "kernelext._core.views.colours": "kernelext._core.colours",
    "kernelext._core.views.conversation": "kernelext._core.conversation",
    "kernelext._core.views.timeline": "kernelext._core.timeline",
    "kernelext._core.views.timeline_axis": "kernelext._core.timeline_axis",
    "kernelext._core.views.timeline_draw": "kernelext._core.timeline_draw",
    "kernelext._core.views.timeline_fold": "kernelext._core.timeline_fold",
    "kernelext._core.views.timeline_svg": "kernelext._core.timeline_svg",
}


# a former module -> where its classes are now (a pickle stored before the move names them so)
CURRENT_MODULES: dict[str, str] = {former: now for now, former in FORMER_MODULES.items()}


def type_name(cls: type) -> str:
    module = cls.__module__
    return f"{FORMER_MODULES.get(module, module)}.{cls.__qualname__}"


def current_module(module: str) -> str:
    """Where a class that ``module`` held before the engine's packages is now."""
    return CURRENT_MODULES.get(module, module)
