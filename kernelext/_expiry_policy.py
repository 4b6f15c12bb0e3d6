"""Deadlines for waiting runs, chosen from the reason the run waits.

Each runtime has its own policy (``runtime().settings.expiry``, changed by
``kx.configure(expiry=...)`` and ``%config Kernelext.expiry``) and hands it to every store
it opens or is given; the store sets a waiting run's deadline from it in its one
``transition`` (``kernelext/_store/runs.py``). ``POLICY`` (the defaults) is the policy of a
store used without a runtime.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

__all__ = ["DEFAULT_EXPIRY", "POLICY", "ExpiryPolicy"]

DEFAULT_EXPIRY: dict[str, dt.timedelta] = {
    "user_stop": dt.timedelta(days=7),
    "approval": dt.timedelta(days=3),
    "input": dt.timedelta(days=3),  # run.ask: waiting for a person's answer
    "decision": dt.timedelta(days=3),  # needs_decision: waiting for someone to reconcile
    "rate_limit": dt.timedelta(hours=1),
    "error": dt.timedelta(days=1),
    "other": dt.timedelta(days=1),
}


_LONGEST = 1000 * 365.25 * 86400  # seconds


def _as_delta(value: object, reason: str | None = None) -> dt.timedelta:
    """A positive, finite duration (seconds or a timedelta); anything else is refused."""
    from ._validate import check_duration

    where = f"expiry[{reason!r}]" if reason is not None else "A suspension's duration"
    try:
        seconds = check_duration(where, value)
    except TypeError as exc:  # a ValueError to callers, as documented
        raise ValueError(str(exc)) from None
    assert seconds is not None
    if seconds > _LONGEST:  # a deadline past year 9999 cannot be stored (check_duration caps too)
        raise ValueError(
            f"{where} of {value!r} is too long for a deadline; the longest is 1000 years."
        )
    return value if isinstance(value, dt.timedelta) else dt.timedelta(seconds=seconds)


class ExpiryPolicy:
    """Per-reason durations; reasons not listed fall back to ``other``."""

    def __init__(self, durations: Mapping[str, object] | None = None) -> None:
        self.durations = dict(DEFAULT_EXPIRY)
        self.update(durations or {})

    def update(self, durations: Mapping[str, object]) -> None:
        checked = {}  # every duration first: a bad one changes nothing
        for reason, value in durations.items():
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(
                    f"An expiry reason is a non-empty name (e.g. 'approval'), not {reason!r}."
                )
            checked[reason] = _as_delta(value, reason)
        self.durations.update(checked)

    def deadline(
        self,
        reason: str,
        now: dt.datetime,
        override: dt.datetime | dt.timedelta | float | None = None,
    ) -> dt.datetime:
        if isinstance(override, dt.datetime):
            if override.tzinfo is not None:
                override = override.astimezone(dt.timezone.utc).replace(tzinfo=None)
            return override
        if override is not None:
            return now + _as_delta(override)
        return now + self.durations.get(reason, self.durations["other"])


POLICY = ExpiryPolicy()  # the defaults, for a store no runtime opened or was given
