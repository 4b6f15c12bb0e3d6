"""The engine-level tests of other modules, run unchanged on PostgreSQL.

The test functions are imported from their modules (stop, engine, ledger, expiry);
pytest collects them here a second time, where ``store`` and ``store_path`` are
this module's fixtures: a fresh database on the session's real server. So the stop
storm, resume, ledger and sweep tests prove the same behaviour on both backends.
Tests that inspect DuckDB files or side files stay DuckDB-only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.live import finish_live_runs
from test_engine import (  # noqa: F401 - collected here against PostgreSQL
    test_a_step_key_used_twice_is_a_clear_error,
    test_code_change_is_refused_unless_allowed,
    test_exception_in_a_step_fails_the_run_and_the_step,
    test_non_json_arguments_give_a_clear_error_in_another_process,
    test_resume_skips_completed_steps_by_key_not_position,
    test_resumed_state_equals_uninterrupted_state,
    test_resuming_a_final_run_is_a_clear_error,
    test_resuming_a_run_that_is_executing_here_is_refused,
    test_run_to_completion_records_steps_events_and_result,
    test_start_with_a_taken_run_id_is_refused,
    test_with_step_bodies_are_skipped_on_resume_and_tracing_is_restored,
)
from test_expiry import (  # noqa: F401
    FakeClock,
    clock,
    test_a_run_resumed_before_the_sweep_is_not_expired,
    test_a_sweep_racing_a_resume_has_exactly_one_winner,
    test_expiry_releases_both_claims_so_another_run_can_take_them,
    test_the_deadline_is_set_at_suspension_from_the_reason,
    test_two_sweeps_produce_exactly_one_expiry,
)
from test_ledger import (  # noqa: F401
    test_failed_effect_is_recorded_raised_and_not_retried_silently,
    test_failed_effect_with_retry_true_is_retried_under_the_same_key,
    test_forced_stop_mid_call_leaves_an_unknown,
    test_intent_is_committed_before_the_call,
    test_non_resumable_effect_not_applied_needs_reconciliation,
    test_pending_intent_on_resume_becomes_unknown_and_blocks_the_call,
    test_resume_returns_the_recorded_result_and_sends_nothing,
    test_row_holds_hash_redacted_args_status_result_and_utc_times,
    test_same_key_with_other_arguments_is_refused_naming_the_key,
)
from test_stop import (  # noqa: F401
    test_except_exception_in_a_step_cannot_swallow_the_stop,
    test_kx_stop_on_a_suspended_run_only_records_the_request,
    test_overrun_without_a_stop_is_only_reported,
    test_step_past_its_time_bound_with_a_stop_pending_is_forced,
    test_stop_at_a_safe_point_suspends_with_the_last_step_durable,
    test_stop_storm_makes_one_transition_and_records_every_request,
)

from kernelext.core import expiry
from kernelext.core.settings import SETTINGS
from kernelext.store import Store, open_store, utcnow

pytestmark = pytest.mark.postgres

WAIT = 60.0


@pytest.fixture
def store_path(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where the imported tests reopen their store: the database's URL."""
    monkeypatch.setenv("KERNELEXT_STORE", postgres_url)
    return postgres_url


@pytest.fixture
def store(store_path: str, request: pytest.FixtureRequest) -> Iterator[Store]:
    """What every imported module's ``store`` fixture gives, on PostgreSQL: the default
    store for kx.* calls, on the fake clock when the test asks for one."""
    fake = request.getfixturevalue("clock") if "clock" in request.fixturenames else None
    durations = dict(SETTINGS.expiry.durations)
    retention = SETTINGS.retention_seconds
    opened = open_store(store_path, clock=fake or utcnow)
    SETTINGS.use_store(opened)
    yield opened
    finish_live_runs()
    SETTINGS.close()
    expiry._CALLBACKS.clear()
    SETTINGS.expiry.durations = durations
    SETTINGS.retention_seconds = retention


__all__ = ["FakeClock"]
