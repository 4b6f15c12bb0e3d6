"""Credentials: facts whose value is never stored, refreshed first thing on resume.

``run.fact("github", token, kind="credential")`` keeps the token in this process's
memory only; the store holds the name and a fingerprint (a SHA-256 prefix, enough
to tell whether a refresh returned a different secret, never the secret itself).

On resume, before any fact is re-checked and before any step runs, every
credential recorded by the completed steps is refreshed by the function
registered with ``kx.credentials.register(name, refresh=fn)`` (called with no
arguments). Without a registration, the fact's own ``check`` (if one was given,
resolved by name like any check) is used as the refresh. A refresh that is
missing, raises, times out or returns ``None`` stops the resume: the run goes
back to ``suspended`` and nothing of it has run.

Inside the resumed run, ``run.credential(name)`` returns the fresh value.

Every text in a credential's value (recorded or refreshed) is also registered with
``kx.secrets``: it is scrubbed from effect arguments, results, error text, events and
log lines before anything is written.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import CredentialError
from ..encoding.codec import dumps_json
from ..encoding.secrets import CREDENTIAL_MIN_LENGTH, SECRETS
from ..process.checks import call_bounded, resolve
from ..process.registries import CredentialRegistry
from ..process.runtime import runtime

if TYPE_CHECKING:
    from ..._store import Store
    from ..engine.run_engine import RunEngine

__all__ = [
    "CredentialError",
    "CredentialRegistry",
    "current",
    "fingerprint",
    "forget",
    "refresh_all",
    "remember",
]

_log = logging.getLogger("kernelext")


def fingerprint(value: Any) -> str:
    """A short SHA-256 prefix of the credential, to tell values apart without keeping them."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    else:
        try:
            data = dumps_json(value)
        except (TypeError, ValueError):
            data = repr(value).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def remember(run_id: str, name: str, value: Any) -> None:
    """Keep the value in memory for the run, and scrub it from everything written."""
    short = _scrub_from_now_on(value)
    rt = runtime()  # values are kept per run, in memory only; dropped when the run ends
    with rt.lock:
        rt.credential_values.setdefault(run_id, {})[name] = value
    if short:
        _log.warning(
            "kernelext: credential %r of run %r holds a text of fewer than %d characters; "
            "it is not scrubbed from what is stored (it would erase ordinary text)",
            name,
            run_id,
            CREDENTIAL_MIN_LENGTH,
        )


def _scrub_from_now_on(value: Any) -> bool:
    """Register every text in ``value`` with kx.secrets; True if one was too short."""
    short = False
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (str, bytes, bytearray, int, float)) and not isinstance(item, bool):
            # bytes as they are (not UTF-8 too: the registry keeps raw byte forms); a number
            # as its text, which is how it is stored (a PIN, an account number)
            form = bytes(item) if isinstance(item, bytearray) else item
            form = str(form) if isinstance(form, (int, float)) else form
            if not SECRETS.add(form) and 0 < len(form) < CREDENTIAL_MIN_LENGTH:
                short = True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
    return short


def forget(run_id: str) -> None:
    """Drop the credential values of run ``run_id`` from memory."""
    rt = runtime()
    with rt.lock:
        rt.credential_values.pop(run_id, None)


def current(run: RunEngine, name: str) -> Any:
    """The credential's value in this process: refreshed on resume, else as recorded."""
    rt = runtime()
    with rt.lock:
        values = rt.credential_values.get(run.id, {})
        if name in values:
            return values[name]
    raise CredentialError(
        f"Credential {name!r} is not available to run {run.id!r} in this process. Record it "
        f"with run.fact({name!r}, value, kind='credential'); on resume it is refreshed by "
        f"kx.credentials.register({name!r}, refresh=fn)."
    )


def refresh_all(
    run: RunEngine, store: Store, rows: Sequence[dict[str, Any]], timeout: float
) -> None:
    """Refresh every credential fact in ``rows``; raise CredentialError if any fails."""
    if not rows:
        return
    calls: list[Callable[[], Any]] = []
    missing: dict[int, str] = {}
    for index, row in enumerate(rows):
        fn = runtime().credentials.refresh_for(row["name"])
        why = ""
        if fn is None and row.get("check_name"):
            fn, why = resolve(row["check_name"], run_id=run.id, fact=row["name"], role="refresh")
        if fn is None:
            missing[index] = why or (
                f"no refresh function: register one with kx.credentials.register("
                f"{row['name']!r}, refresh=fn)"
            )
            calls.append(_nothing)
        else:
            calls.append(fn)
    outcomes = call_bounded(calls, timeout)
    now = store.now()
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    for index, (row, outcome) in enumerate(zip(rows, outcomes, strict=True)):
        status, detail, fp = "refreshed", "", None
        if index in missing:
            status, detail = "unresolved", missing[index]
        elif outcome.status != "ok":
            status, detail = outcome.status, outcome.detail
        elif outcome.value is None:
            status, detail = "error", "the refresh function returned None"
        else:
            fp = fingerprint(outcome.value)
            remember(run.id, row["name"], outcome.value)
            detail = "changed" if fp != row.get("fingerprint") else "same value"
        if status != "refreshed":
            failures.append(f"{row['name']!r}: {detail}")
        results.append(
            {
                "name": row["name"],
                "checked_at": now,
                "current_value": None,
                "status": status,
                "detail": detail,  # scrubbed by the store's write path
                "fingerprint": fp,
            }
        )
    store.save_fact_checks(run.id, results, event_kind="credentials_refreshed")
    if failures:
        raise CredentialError(
            f"Resume of run {run.id!r} stopped before anything ran: credential(s) could not be "
            f"refreshed ({'; '.join(failures)}). The run stays suspended. Fix the refresh "
            f"function (kx.credentials.register(name, refresh=fn)) and call "
            f"kx.resume({run.id!r}) again."
        )


def _nothing() -> None:
    return None
