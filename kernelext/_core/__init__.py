"""The engine: runs, steps, the stop flag, the ledger, facts and expiry. No Jupyter here."""
