"""Benchmarks for kernelext, run with ``python -m benchmarks`` (or ``make bench``).

Every figure is measured in one run, next to anchors measured in the same run (a
DuckDB commit, a SQLite WAL commit, a bare fsync), because this machine is noisy:
compare ratios, not absolute numbers from different runs. Results go to
``benchmarks/results/latest.json``; ``BENCHMARKS.md`` explains them.

This package imports nothing heavy at import time: the resume benchmark starts
child processes that import it and must measure kernelext's own import cost.
"""

RESULTS_SCHEMA = 1
