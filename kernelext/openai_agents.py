"""``kx.openai_agents`` (``pip install 'kernelext[agents]'``): an OpenAI Agents SDK run as a
kernelext run.

``kx.openai_agents.start(agent, input, run_id=..., max_turns=...)`` runs
``Runner.run(agent, input)`` and returns the run's handle. Each model answer is recorded
and replayed on resume (the model is never asked a turn twice), each function tool call is
an effect keyed by run, turn, tool and place (applied once across Stop, resume and a killed
kernel; an unknown outcome waits in ``kx.reconcile``; a tool's ``needs_approval`` is asked
through ``kx.approvals``), and a Stop lands at the next turn. ``h.result`` is the run's
``final_output``. ``on_event=callback`` makes the run ``Runner.run_streamed``: the callback
gets each event the SDK yields, and each turn is recorded as its final response (a resumed
run replays it, streamed or not). After a kernel restart, build the agent again and call
``kx.openai_agents.agent(agent)`` before ``kx.resume(run_id)``. The SDK is imported on first
use, never by ``import kernelext``.
"""

from __future__ import annotations

from ._adapters.openai_agents import MODEL_TOOL, agent, start

__all__ = ["MODEL_TOOL", "agent", "start"]
