"""The premises a run depends on: facts and credentials, recorded, re-checked and refreshed
before a resume.

May import, inside the engine: encoding, process, engine.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
