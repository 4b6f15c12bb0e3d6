"""The view tests' shared fixtures: ``llm``, the scripted model server (support.llm_fixtures)."""

from support.llm_fixtures import llm  # noqa: F401  (fixture)
