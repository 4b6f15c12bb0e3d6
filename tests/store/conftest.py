"""The store tests' shared fixtures: ``places`` (support.sql_paths)."""

from support.sql_paths import places  # noqa: F401  (fixture)
