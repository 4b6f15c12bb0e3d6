"""Which stores a click from a notebook may open, and how: the one door of the server route.

A click names its run's store by address (``from_elsewhere``). The notebook server opens
only a store that a notebook of the same user showed (``shown_stores``: checked before any
file is opened or connection made, so a click crafted to name another host never makes the
server connect there with its own credentials) and that is already a kernelext store, with
bounded waits, and never through an option that would make it read or write a file of its
choosing:

- a DuckDB path: absolute, an existing regular file with kernelext's ``.want`` beside it,
  opened with a short wait for the file (``STORE_WAIT``);
- a PostgreSQL URL: read as libpq reads it (``psycopg.conninfo``), one host, only the
  options in ``ALLOWED_OPTIONS`` (anything else, such as ``sslkeylogfile`` or
  ``sslrootcert``, belongs in the server process's own ``PG*`` environment), a connect
  timeout of ``CONNECT_TIMEOUT`` whatever the URL says, lock and statement timeouts, and a
  database that already holds kernelext's tables (nothing is created there).

``busy_key`` names what a click waits on (a file, a database host), so that the route can
let a bounded number of clicks wait on each: one store that hangs never holds every thread.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import TYPE_CHECKING, Any

from ..._store import Store, is_postgres, open_store
from ..._store.posted_stops import post_stop_at
from ...errors import StoreError

if TYPE_CHECKING:
    from ..._store.duckdb.mailbox import Posted

__all__ = [
    "ALLOWED_OPTIONS",
    "CONNECT_TIMEOUT",
    "STORE_WAIT",
    "busy_key",
    "is_postgres",
    "open_for_click",
    "post_click_stop",
]

STORE_WAIT = 5.0  # seconds a click waits for another process to hand the DuckDB file over
CONNECT_TIMEOUT = 5  # seconds a click waits for a PostgreSQL server to answer
LOCK_TIMEOUT_MS = 4000  # a run row locked by another session: refused, not waited for
STATEMENT_TIMEOUT_MS = 8000
ALLOWED_OPTIONS = frozenset(
    {"host", "hostaddr", "port", "dbname", "user", "password", "sslmode", "application_name"}
)
_SCHEMES = ("postgresql://", "postgres://")


def busy_key(address: object) -> str:
    """What clicks on ``address`` wait for: its PostgreSQL host and port, or its file."""
    if not isinstance(address, str):
        return ""
    if is_postgres(address):
        try:
            parts = urllib.parse.urlsplit(address)
            return f"postgresql://{parts.hostname or ''}:{parts.port or ''}"
        except ValueError:
            return "postgresql://?"
    return os.path.abspath(address) if address else ""


def open_for_click(address: object, *, shown_in: str | os.PathLike[str]) -> Store:
    """Open the kernelext store at ``address`` for one click; refuse anything else.

    ``shown_in``: the folder where this user's kernels recorded the stores their panels
    showed (``shown_stores``); any other address is refused before a file is opened or a
    connection made."""
    if _admitted(address, shown_in):
        return _open_postgres(str(address))
    _check_duckdb(str(address))
    return open_store(str(address), wait_timeout=STORE_WAIT)


def post_click_stop(
    address: object,
    run_id: str,
    *,
    shown_in: str | os.PathLike[str],
    source: str,
    who: str | None,
    epoch: int | None,
    force: bool,
) -> Posted | None:
    """A click's Stop or Force stop recorded beside a DuckDB store whose file another
    process keeps (a long query), without opening it; None: open it and record as usual.
    Only a store a panel showed (as ``open_for_click``)."""
    if _admitted(address, shown_in):
        return None
    _check_duckdb(str(address))
    return post_stop_at(str(address), run_id, source=source, who=who, epoch=epoch, force=force)


def _admitted(address: object, shown_in: str | os.PathLike[str]) -> bool:
    """Refuse an address no panel of this user showed (nothing opened); True: PostgreSQL."""
    from .shown_stores import NOT_SHOWN, was_shown

    if not isinstance(address, str) or not address.strip():
        raise ValueError("No store was named: the panel sends the address of its run's store.")
    postgres = is_postgres(address)
    if postgres and not address.startswith(_SCHEMES):
        raise ValueError(
            "Write the store's scheme in lower case (postgresql://...): the panel sends the "
            "address as kernelext wrote it."
        )
    if not postgres and not os.path.isabs(address):
        raise ValueError(f"The store path must be absolute, not {address!r}.")
    if not was_shown(shown_in, address):
        raise ValueError(NOT_SHOWN)
    return postgres


def _check_duckdb(address: str) -> None:
    if not os.path.isfile(address):
        raise ValueError(
            f"No kernelext store at {address!r} (no such file): the run's kernel may have "
            "moved or deleted it."
        )
    if not os.path.exists(address + ".want"):  # every kernelext open leaves it beside the file
        raise ValueError(
            f"{address!r} is not a kernelext store (no kernelext process ever opened it): "
            "nothing was changed."
        )


def _open_postgres(address: str) -> Store:
    options = _conninfo(address)
    url = _url(options)
    _require_kernelext_tables(url)
    return open_store(url)


def _conninfo(address: str) -> dict[str, Any]:
    from psycopg import conninfo  # PostgreSQL only

    try:
        options = conninfo.conninfo_to_dict(address)
    except Exception:  # libpq's message may quote the address: not repeated
        raise ValueError(
            "The PostgreSQL address could not be read as libpq reads it: the panel sends "
            "the address as kernelext wrote it."
        ) from None
    refused = sorted(set(options) - ALLOWED_OPTIONS - {"connect_timeout"})
    if refused:
        raise ValueError(
            f"The notebook server opens a PostgreSQL store only with the options "
            f"{', '.join(sorted(ALLOWED_OPTIONS))}; this address also sets "
            f"{', '.join(refused)}. Set those in the environment of the process that runs "
            "`jupyter lab` (PGSSLROOTCERT, ...)."
        )
    for name in ("host", "hostaddr", "port"):
        if "," in str(options.get(name, "")):
            raise ValueError(
                "The notebook server opens a PostgreSQL store on one host; this address "
                f"lists several in {name}."
            )
    options["connect_timeout"] = CONNECT_TIMEOUT  # whatever the address says (0: forever)
    return options


def _url(options: dict[str, Any]) -> str:
    """A postgresql:// URL with exactly ``options`` plus the server's timeouts."""
    quote = urllib.parse.quote
    user = quote(str(options.get("user", "")), safe="")
    password = options.get("password")
    userinfo = f"{user}:{quote(str(password), safe='')}@" if password is not None else ""
    if not userinfo and user:
        userinfo = f"{user}@"
    host = str(options.get("host", ""))
    if ":" in host:
        host = f"[{host}]"
    port = f":{options['port']}" if options.get("port") else ""
    dbname = quote(str(options.get("dbname", "")), safe="")
    query = {k: str(v) for k, v in options.items() if k not in {"user", "password", "host", "port"}}
    query.pop("dbname", None)
    query["options"] = (
        f"-c lock_timeout={LOCK_TIMEOUT_MS} -c statement_timeout={STATEMENT_TIMEOUT_MS}"
    )
    encoded = urllib.parse.urlencode(query, quote_via=urllib.parse.quote)  # libpq: no "+"
    return f"postgresql://{userinfo}{host}{port}/{dbname}?{encoded}"


def _require_kernelext_tables(url: str) -> None:
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as con:
            row = con.execute(
                "SELECT to_regclass('schema_version') IS NOT NULL"
                " AND to_regclass('runs') IS NOT NULL"
            ).fetchone()
    except psycopg.Error as exc:
        raise StoreError(_first_line(exc)) from None
    if not (row and row[0]):
        raise ValueError(
            "That PostgreSQL database is not a kernelext store (it has no kernelext tables): "
            "nothing was created or changed there."
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def passwords_in(address: str) -> list[str]:
    """The secrets an address carries (its password, a key's passphrase), as libpq reads
    them and as written: to be kept out of every answer and log line."""
    found: list[str] = []
    if not isinstance(address, str):
        return found
    try:
        from psycopg import conninfo

        options = conninfo.conninfo_to_dict(address)
        found += [str(options[k]) for k in ("password", "sslpassword") if options.get(k)]
    except Exception:  # not readable: the raw forms below still find it
        pass
    head = address.split("://", 1)[-1]
    authority = head.rsplit("@", 1)[0] if "@" in head else ""
    if ":" in authority:
        found.append(authority.split(":", 1)[1])
    for pair in address.split("?", 1)[-1].split("&") if "?" in address else []:
        key, _, value = pair.partition("=")
        if "password" in urllib.parse.unquote(key).lower() and value:
            found.append(value)
    return sorted({f for f in found if f}, key=len, reverse=True)
