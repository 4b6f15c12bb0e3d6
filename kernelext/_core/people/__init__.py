"""What a person is asked and decides: suspending for a person, approval requests and
decisions, questions and answers, decisions on unknown effects, and decisions that reach the
store without the kernel.

May import, inside the engine: encoding, process, engine.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
