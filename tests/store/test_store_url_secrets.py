"""What travels to other processes is the store's connection string with every secret left
out, however the string spells it: libpq decodes percent-encoded parameter names in a URL
(``pass%77ord=``), reads ``sslpassword=`` and the password in the user information, and
takes the key=value form with quoted values. Checked against libpq's own parser."""

from __future__ import annotations

import urllib.parse

from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import pq

from kernelext._store.postgres_backend import url_without_password

SECRET_KEYWORDS = {"password", "sslpassword"}
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
SECRETS = TEXT.map(lambda text: f"Zk9{text}Qx7")  # a mark no other part of the string has


def libpq(conninfo: str) -> dict[str, str]:
    """The parameters libpq reads from ``conninfo`` (what a connection would use)."""
    return {
        o.keyword.decode(): o.val.decode()
        for o in pq.Conninfo.parse(conninfo.encode())
        if o.val is not None
    }


@st.composite
def spelled(draw: st.DrawFn, name: str) -> str:
    """``name`` with any of its characters percent-encoded (upper- or lower-case hex)."""
    out = []
    for char in name:
        how = draw(st.sampled_from(["plain", "upper", "lower"]))
        code = f"%{ord(char):02X}"
        out.append(char if how == "plain" else code if how == "upper" else code.lower())
    return "".join(out)


def encoded(value: str) -> str:
    return urllib.parse.quote(value, safe="")


@st.composite
def urls(draw: st.DrawFn) -> tuple[str, str]:
    """(a postgresql:// URL holding a secret somewhere, that secret)."""
    secret = draw(SECRETS)
    where = draw(st.sampled_from(["userinfo", "password", "sslpassword"]))
    userinfo = "app" + (f":{encoded(secret)}" if where == "userinfo" else "")
    if draw(st.booleans()):  # the user name percent-encoded too
        userinfo = draw(spelled("app")) + userinfo[3:]
    params = [f"application_name={encoded(draw(TEXT))}", "sslmode=prefer"]
    if where != "userinfo":
        params.insert(draw(st.integers(0, 2)), f"{draw(spelled(where))}={encoded(secret)}")
    if draw(st.booleans()):  # given twice: libpq takes the last one
        params.insert(0, f"{draw(spelled('password'))}={encoded(draw(SECRETS))}")
    scheme = draw(st.sampled_from(["postgresql", "postgres"]))
    host = draw(st.sampled_from(["localhost:5432", "db.example:6543,replica:6544", "[::1]", ""]))
    return f"{scheme}://{userinfo}@{host}/kx?{'&'.join(params)}", secret


def quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@st.composite
def keyword_strings(draw: st.DrawFn) -> tuple[str, str]:
    """(a key=value connection string holding a secret, that secret)."""
    secret = draw(SECRETS)
    eq = draw(st.sampled_from(["=", " = ", "= "]))
    pairs = [f"host{eq}localhost", f"user{eq}app", f"application_name{eq}{quoted(draw(TEXT))}"]
    for keyword in draw(st.sets(st.sampled_from(sorted(SECRET_KEYWORDS)), min_size=1)):
        pairs.insert(draw(st.integers(0, len(pairs))), f"{keyword}{eq}{quoted(secret)}")
    return " ".join(pairs), secret


def assert_stripped(given_string: str, secret: str) -> None:
    out = url_without_password(given_string)
    seen = libpq(out)
    assert not SECRET_KEYWORDS & seen.keys(), out
    assert secret not in out and secret not in urllib.parse.unquote(out), out
    wanted = {k: v for k, v in libpq(given_string).items() if k not in SECRET_KEYWORDS}
    assert seen == wanted  # everything else reaches the worker as libpq read it


@settings(max_examples=300, deadline=None)
@given(urls())
def test_a_url_never_carries_a_password_however_it_is_spelled(case: tuple[str, str]) -> None:
    assert_stripped(*case)


@settings(max_examples=200, deadline=None)
@given(keyword_strings())
def test_a_key_value_string_never_carries_a_password(case: tuple[str, str]) -> None:
    assert_stripped(*case)


def test_a_url_stays_a_url_and_reads_as_one() -> None:
    url = "postgres://app:pw@db.example:6543/kx?sslmode=require&pass%77ord=x&sslpassword=y"
    assert url_without_password(url) == "postgresql://app@db.example:6543/kx?sslmode=require"
