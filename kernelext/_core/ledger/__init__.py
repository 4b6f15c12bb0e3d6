"""`@kx.effect`: every external call keyed, its intent durable before it and its outcome after,
with approvals, limits, retries and probes of unknown outcomes.

May import, inside the engine: encoding, process, engine, people.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
