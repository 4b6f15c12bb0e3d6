"""Starting, executing, stopping (from here or elsewhere), taking over, resuming, restarting
and expiring runs; the one interface to a run (`control`), the runs overview, and the façade
an agent receives (`Run`).

May import, inside the engine: every other package of the engine.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
