"""Fixtures of the agent-framework adapter tests: the scripted model server (``llm``), the
delivery server (``deliveries``) and ``released_hold``, taken by the modules that use them."""

from support.agent_fixtures import deliveries, llm, released_hold  # noqa: F401  (fixtures)
