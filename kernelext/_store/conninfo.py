"""A PostgreSQL connection string without its secrets, read as libpq reads it.

What may travel to other processes (``run.map`` workers, a click answered elsewhere)
is the store's connection string with every secret left out: the password in the URL's
user information, ``password=``, ``sslpassword=`` and any parameter libpq marks as a
secret (``oauth_client_secret``, ...). The string is parsed by libpq itself
(``PQconninfoParse``), so a parameter name written percent-encoded (``pass%77ord=``), a
value quoted in the ``key=value`` form, or a parameter given twice are seen as libpq
sees them; the result is rebuilt from what it parsed, so nothing of the secret's text is
carried over.
"""

from __future__ import annotations

import re
import urllib.parse

from psycopg import pq
from psycopg.conninfo import make_conninfo

from ..errors import StoreError

__all__ = ["URL_PREFIXES", "url_without_password"]

URL_PREFIXES = ("postgresql://", "postgres://")
_PLAIN_HOST = re.compile(r"[A-Za-z0-9._-]+")  # a host name or IPv4 address, one of them


def _parsed(conninfo: str) -> list[tuple[str, str]]:
    """(keyword, value) of each parameter ``conninfo`` gives, secrets left out."""
    try:
        options = pq.Conninfo.parse(conninfo.encode())
    except Exception as exc:  # psycopg.OperationalError: what libpq could not read
        raise StoreError(
            "The PostgreSQL connection string of the kernelext store cannot be read as "
            f"libpq reads it ({type(exc).__name__}); check KERNELEXT_STORE."
        ) from None
    return [
        (option.keyword.decode(), option.val.decode())
        for option in options
        if option.val is not None and option.dispchar != b"*"  # libpq: a secret
    ]


def url_without_password(url: str) -> str:
    """``url`` (a ``postgresql://`` URL or a ``key=value`` string) with every secret left
    out: what may travel to other processes, which connect with their own credentials.
    A URL stays a URL (``postgresql://user@host:port/db?...``), a ``key=value`` string
    stays one."""
    kept = dict(_parsed(url))
    if not url.startswith(URL_PREFIXES):
        return make_conninfo("", **kept)
    quote = urllib.parse.quote
    user = kept.pop("user", None)
    netloc = f"{quote(user, safe='')}@" if user else ""
    host, port = kept.get("host"), kept.get("port", "")
    if host and _PLAIN_HOST.fullmatch(host) and (port.isdigit() or not port):
        netloc += host + (f":{port}" if port else "")
        kept.pop("host")
        kept.pop("port", None)
    dbname = kept.pop("dbname", None)
    path = f"/{quote(dbname, safe='')}" if dbname else ""
    query = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in kept.items())
    return f"postgresql://{netloc}{path}" + (f"?{query}" if query else "")
