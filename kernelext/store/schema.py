"""Schema of the store: an append-only list of migrations plus a version table.

Every backend runs the same statements. Timestamps are ``TIMESTAMP`` holding UTC.
Keys that the engine derives (effects, steps, snapshots, blobs) are 128-bit UUIDs.
Never edit a migration that has shipped; append a new one.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MIGRATIONS", "TABLES", "Migration"]


class Migration(NamedTuple):
    version: int
    description: str
    statements: tuple[str, ...]


_V1 = (
    """CREATE TABLE IF NOT EXISTS runs (
        id TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        status TEXT NOT NULL,
        reason TEXT,
        created_at TIMESTAMP NOT NULL,
        updated_at TIMESTAMP NOT NULL,
        deadline TIMESTAMP,
        parent_id TEXT,
        fingerprint TEXT,
        max_step_seconds DOUBLE PRECISION,
        args TEXT,
        stop_requested_at TIMESTAMP,
        stop_source TEXT,
        owner TEXT,
        lease_until TIMESTAMP,
        total_steps INTEGER,
        completed_steps INTEGER NOT NULL DEFAULT 0,
        error TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS steps (
        id UUID PRIMARY KEY,
        run_id TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        key TEXT NOT NULL,
        name TEXT,
        status TEXT NOT NULL,
        started_at TIMESTAMP NOT NULL,
        ended_at TIMESTAMP,
        duration_s DOUBLE PRECISION,
        snapshot_id UUID,
        forced BOOLEAN NOT NULL DEFAULT FALSE,
        error TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS snapshots (
        id UUID PRIMARY KEY,
        run_id TEXT NOT NULL,
        step_ordinal INTEGER NOT NULL,
        created_at TIMESTAMP NOT NULL,
        manifest TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        removed_at TIMESTAMP
    )""",
    """CREATE TABLE IF NOT EXISTS blobs (
        id UUID PRIMARY KEY,
        run_id TEXT NOT NULL,
        encoding TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        size BIGINT NOT NULL,
        location TEXT NOT NULL,
        base_id UUID,
        data BLOB,
        created_at TIMESTAMP NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS effects (
        key UUID PRIMARY KEY,
        run_id TEXT NOT NULL,
        step_key TEXT NOT NULL,
        step_ordinal INTEGER,
        tool TEXT NOT NULL,
        call_ordinal INTEGER NOT NULL,
        args_hash TEXT NOT NULL,
        args TEXT,
        status TEXT NOT NULL,
        resumable BOOLEAN NOT NULL DEFAULT TRUE,
        result TEXT,
        error TEXT,
        intent_at TIMESTAMP NOT NULL,
        outcome_at TIMESTAMP,
        decided_by TEXT,
        decision_note TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS facts (
        run_id TEXT NOT NULL,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        value TEXT,
        fingerprint TEXT,
        check_name TEXT,
        check_args TEXT,
        tolerance DOUBLE PRECISION,
        step_ordinal INTEGER,
        recorded_at TIMESTAMP NOT NULL,
        checked_at TIMESTAMP,
        current_value TEXT,
        check_status TEXT,
        check_detail TEXT,
        PRIMARY KEY (run_id, name)
    )""",
    """CREATE TABLE IF NOT EXISTS claims (
        id UUID PRIMARY KEY,
        resource TEXT NOT NULL,
        run_id TEXT NOT NULL,
        amount DOUBLE PRECISION,
        claimed_at TIMESTAMP NOT NULL,
        released_at TIMESTAMP,
        release_reason TEXT
    )""",
    "CREATE SEQUENCE IF NOT EXISTS events_seq",
    """CREATE TABLE IF NOT EXISTS events (
        id BIGINT PRIMARY KEY DEFAULT nextval('events_seq'),
        run_id TEXT,
        occurred_at TIMESTAMP NOT NULL,
        kind TEXT NOT NULL,
        from_status TEXT,
        to_status TEXT,
        source TEXT,
        actor TEXT,
        reason TEXT,
        detail TEXT
    )""",
)

_V2_FACT_COMPARATOR = (
    # The qualified name of a fact's custom comparator (``run.fact(..., compare=fn)``).
    "ALTER TABLE facts ADD COLUMN IF NOT EXISTS compare_name TEXT",
)

_V3_JOURNAL = (
    # How far each process's write-ahead journal has been folded into the tables.
    """CREATE TABLE IF NOT EXISTS journal_state (
        journal_id TEXT PRIMARY KEY,
        last_seq BIGINT NOT NULL
    )""",
)

_V4_QUARANTINE = (
    # Journal records the tables refused, and damaged stretches of journal files: kept
    # where a person sees them, never dropped.
    """CREATE TABLE IF NOT EXISTS quarantine (
        id UUID PRIMARY KEY,
        journal_id TEXT NOT NULL,
        seq BIGINT,
        kind TEXT NOT NULL,
        run_id TEXT,
        payload TEXT,
        error TEXT NOT NULL,
        file TEXT,
        quarantined_at TIMESTAMP NOT NULL
    )""",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _V1),
    Migration(2, "facts.compare_name", _V2_FACT_COMPARATOR),
    Migration(3, "journal_state", _V3_JOURNAL),
    Migration(4, "quarantine", _V4_QUARANTINE),
)

TABLES = ("runs", "steps", "snapshots", "blobs", "effects", "facts", "claims", "events")

SCHEMA_VERSION_DDL = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at TIMESTAMP NOT NULL
)"""
