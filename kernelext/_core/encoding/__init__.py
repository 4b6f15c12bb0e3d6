"""Deterministic encodings a run's records rely on: names checked, values hashed and keyed,
results, state and data arguments encoded, secrets scrubbed.

May import, inside the engine: nothing else in the engine.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
