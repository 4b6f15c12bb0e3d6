"""The one `Runtime` of a process: options, definitions registered by name (checks,
credentials, probes), the open store and the stores a click may open, the module-level API
(`kx.sql`, `kx.runs`), and who owns a run (leases).

May import, inside the engine: encoding.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
