"""The surface tests' shared fixtures: ``llm``, the scripted model server
(support.llm_fixtures); of the agent-framework adapter tests (support.agent_fixtures) the
delivery server (``deliveries``) and ``released_hold``, taken by the modules that use them."""

from support.agent_fixtures import deliveries, released_hold  # noqa: F401  (fixtures)
from support.llm_fixtures import llm  # noqa: F401  (fixture)
