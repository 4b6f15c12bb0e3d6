"""``kx.pydantic_ai`` (``pip install 'kernelext[pydantic-ai]'``): a Pydantic AI agent's run as a
kernelext run, with kernelext as the agent's durable execution engine.

``kx.pydantic_ai.start(agent, prompt, run_id=..., deps=...)`` runs ``agent.run(prompt)`` and
returns the run's handle. The run gives the agent kernelext's durability capability (Pydantic
AI's ``durable_exec`` interface, as ``DBOSDurability`` or ``TemporalDurability`` are built):
each model answer is recorded and replayed on resume (the model is never asked a turn twice),
each tool call is an effect keyed by run, turn, tool and place (applied once across Stop,
resume and a killed kernel; an unknown outcome waits in ``kx.reconcile``; a tool's
``requires_approval=True`` is asked through ``kx.approvals``), and a Stop lands at the next
turn. ``h.result`` is the run's ``output``. ``event_stream_handler=`` streams each model
request to the handler as it comes and records it as its final response. After a kernel
restart, build the agent again and call ``kx.pydantic_ai.agent(agent)`` before
``kx.resume(run_id)``. ``durability()`` is the capability itself, for an agent built with it.
Pydantic AI is imported on first use, never by ``import kernelext``.
"""

from __future__ import annotations

from ._adapters.pydantic_ai import MODEL_TOOL, agent, durability, start

__all__ = ["MODEL_TOOL", "agent", "durability", "start"]
