"""Schema of the store: an append-only list of migrations plus a version table.

Every backend runs the same statements. Timestamps are ``TIMESTAMP`` holding UTC.
Keys that the engine derives (effects, steps, snapshots, blobs) are 128-bit UUIDs.
Never edit a migration that has shipped; append a new one.
"""

from __future__ import annotations

from typing import NamedTuple

from ..status import Status

__all__ = ["MIGRATIONS", "TABLES", "VIEWS", "Migration"]


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

_V5_APPROVALS_AND_INPUTS = (
    # Requests to approve one call of an effect (``@kx.effect(needs_approval=...)``): bound
    # to the effect's key and argument hash, decided once, consumed by one call. A request
    # made again for the same key (other arguments, or the first one expired) supersedes it.
    """CREATE TABLE IF NOT EXISTS approvals (
        id UUID PRIMARY KEY,
        key UUID NOT NULL,
        run_id TEXT NOT NULL,
        step TEXT NOT NULL,
        step_ordinal INTEGER,
        call_ordinal INTEGER NOT NULL,
        tool TEXT NOT NULL,
        args_hash TEXT NOT NULL,
        args TEXT,
        requested_at TIMESTAMP NOT NULL,
        expires_at TIMESTAMP,
        decided_at TIMESTAMP,
        decision TEXT,
        actor TEXT,
        note TEXT,
        consumed_at TIMESTAMP,
        superseded_at TIMESTAMP
    )""",
    # Questions an agent asked a person (``run.ask``) and the answers, replayed on resume.
    """CREATE TABLE IF NOT EXISTS inputs (
        key UUID PRIMARY KEY,
        run_id TEXT NOT NULL,
        step TEXT NOT NULL,
        step_ordinal INTEGER,
        call_ordinal INTEGER NOT NULL,
        prompt TEXT NOT NULL,
        answer_schema TEXT,
        default_answer TEXT,
        asked_at TIMESTAMP NOT NULL,
        expires_at TIMESTAMP,
        answer TEXT,
        answered_at TIMESTAMP,
        actor TEXT,
        note TEXT
    )""",
)

_V6_LANGGRAPH = (
    # LangGraph checkpoints (``kx.langgraph``; store/checkpoints.py): a checkpoint without
    # its channel values, each channel version stored once, and the tasks' pending writes.
    """CREATE TABLE IF NOT EXISTS langgraph_checkpoints (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        parent_checkpoint_id TEXT,
        step INTEGER,
        source TEXT,
        graph_run_id TEXT,
        encoding TEXT NOT NULL,
        checkpoint BLOB NOT NULL,
        metadata TEXT NOT NULL,
        channel_versions TEXT NOT NULL,
        created_at TIMESTAMP NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    )""",
    """CREATE TABLE IF NOT EXISTS langgraph_blobs (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        channel TEXT NOT NULL,
        version TEXT NOT NULL,
        encoding TEXT NOT NULL,
        value BLOB,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
    )""",
    """CREATE TABLE IF NOT EXISTS langgraph_writes (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        task_path TEXT NOT NULL,
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        encoding TEXT NOT NULL,
        value BLOB,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    )""",
)

_V7_TRUST = (
    # The owner epoch: every take-over of a run increments it, and every write a process
    # makes for a run carries the epoch it owns; a stale one is refused (fencing).
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS owner_epoch BIGINT DEFAULT 0",
    # How the run's effect keys and argument hashes are derived; NULL: recorded before
    # schema 7 (scheme 1: NUL-joined keys, type-name hashes), kept so resumes repeat nothing.
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS key_scheme INTEGER",
    # When the run's expiry was delivered to ``kx.on_expire`` callbacks (at least once).
    "ALTER TABLE runs ADD COLUMN IF NOT EXISTS expiry_notified_at TIMESTAMP",
    # Expirations from before schema 7 are not delivered late: no callback waited for them.
    # (A migration binds no parameters: the status comes from the status module.)
    "UPDATE runs SET expiry_notified_at = updated_at WHERE status = '" + Status.EXPIRED + "'",
)

_V8_QUESTIONS = (
    # Questions to a person (``run.ask``, ``kx.questions``) are called questions from the
    # API to the table; the view ``inputs`` keeps SQL written for schemas 5 to 7 reading.
    # It is read-only on every backend: DuckDB never writes through a view, and the
    # OFFSET makes it one that PostgreSQL does not update automatically either.
    "ALTER TABLE inputs RENAME TO questions",
    "CREATE VIEW inputs AS SELECT * FROM questions OFFSET 0",
)

_V9_BATCHES = (
    # ``run.map`` items: an item's step stores the value it returned (the encoding effect
    # results use), replayed on resume instead of running the item again.
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS result TEXT",
    # ``@kx.effect(retries=...)``: how many times the call was made under its key.
    "ALTER TABLE effects ADD COLUMN IF NOT EXISTS attempts INTEGER",
)

_V10_HEARTBEATS = (
    # ``run.map`` items in other processes: the worker running a step's attempt renews this
    # every few seconds; a take-over asks no probe for an item whose worker is still alive.
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS heartbeat_at TIMESTAMP",
)

_V11_APPROVAL_EDITS = (
    # An approval with edits (``approve(edit={...})``): the edited values, stored as results
    # are (the call gets them back), the edited call as shown, and the edited call's hash,
    # recorded when the call uses the approval. ``args``/``args_hash`` keep the original call.
    "ALTER TABLE approvals ADD COLUMN IF NOT EXISTS edit TEXT",
    "ALTER TABLE approvals ADD COLUMN IF NOT EXISTS edited_args TEXT",
    "ALTER TABLE approvals ADD COLUMN IF NOT EXISTS edited_args_hash TEXT",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", _V1),
    Migration(2, "facts.compare_name", _V2_FACT_COMPARATOR),
    Migration(3, "journal_state", _V3_JOURNAL),
    Migration(4, "quarantine", _V4_QUARANTINE),
    Migration(5, "approvals and inputs", _V5_APPROVALS_AND_INPUTS),
    Migration(6, "langgraph checkpoints", _V6_LANGGRAPH),
    Migration(7, "owner epoch, key scheme, expiry delivery", _V7_TRUST),
    Migration(8, "questions: the table inputs renamed, inputs kept as a view", _V8_QUESTIONS),
    Migration(9, "batches: item results, effect attempts", _V9_BATCHES),
    Migration(10, "steps.heartbeat_at: item attempts in other processes", _V10_HEARTBEATS),
    Migration(11, "approvals with edits: edit, edited_args, edited_args_hash", _V11_APPROVAL_EDITS),
)

TABLES = (
    "runs",
    "steps",
    "snapshots",
    "blobs",
    "effects",
    "facts",
    "claims",
    "events",
    "approvals",
    "questions",
)

# Read-only views kept so that SQL written against older schemas still reads (schema 8:
# ``inputs``, the former name of ``questions``).
VIEWS = ("inputs",)

SCHEMA_VERSION_DDL = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at TIMESTAMP NOT NULL
)"""
