"""The embedded DuckDB backend, and everything only it needs.

- ``backend``: one long-lived connection per process, opened while it holds the file;
- ``handoff``: processes take turns with the file (DuckDB allows one at a time);
- ``journal``, ``fold``, ``hot_path``: hot-path records are durable after one fdatasync and
  folded into the tables in batches, never dropped;
- ``recovery``: journals of processes that died are folded by the next open;
- ``checkpoint``: DuckDB's checkpoint, undone by the next open when a kill cut it short;
- ``side_files``: payloads over 64 KiB in files beside the store;
- ``platform``: the few POSIX calls, with what each platform offers.
"""

from __future__ import annotations

from .backend import DUCKDB_CONFIG, DuckDBConnection, duckdb_config, open_duckdb

__all__ = ["DUCKDB_CONFIG", "DuckDBConnection", "duckdb_config", "open_duckdb"]
