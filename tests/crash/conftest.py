"""The crash tests' shared fixtures: ``small_disk`` (support.small_disk)."""

from support.small_disk import small_disk  # noqa: F401  (fixture)
