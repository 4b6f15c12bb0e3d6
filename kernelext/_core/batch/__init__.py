"""`run.map` / `run.amap`: items as steps, read from their source, dispatched to threads, tasks
or other processes, drained on a stop.

May import, inside the engine: encoding, process, engine.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
