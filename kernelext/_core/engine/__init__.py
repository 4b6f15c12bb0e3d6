"""One run as it executes: its steps, state snapshots, the stop flag and safe points, forced
stops, stops posted beside a busy store, the step or item executing now.

May import, inside the engine: encoding, process.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
