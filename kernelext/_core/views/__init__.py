"""How a run reads to a person, from the store: colours, the conversation, the timeline
picture.

May import, inside the engine: encoding, process.
Outside the engine: `kernelext._store` and the top-level modules (`errors`, `status`,
`_validate`, ...).
The order is checked by tests/contracts/test_layering.py; this package re-exports nothing.
"""
