"""`kx.plan`: what a resume would do, computed without changing anything, and how it is shown.

May import, inside the engine: encoding, process, views, facts, ledger, batch.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
