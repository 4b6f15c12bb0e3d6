"""Secrets never reach the disk (issue 12, item 5).

Planted values go through effect arguments named like secrets, DSNs and URLs with a
password, a registered secret returned in a result and raised in an exception, a
credential fact and kernelext's log. Then every file the store wrote is read byte by
byte: the DuckDB file, its WAL, the side files, the quarantine folder, and the journal
of a worker process SIGKILLed before its journal was folded. A visible canary, passed
the same way, must be found there: it shows the grep can see what was written.

Run as a script (``python test_secrets.py STORE``), this file is that worker.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kernelext as kx
from kernelext._core.encoding.secrets import MASK, REDACTED, SECRETS, is_secret_name, scrub_text

WAIT = 60.0
PLANTED: dict[str, str] = {}  # name -> value, set by the test (or the worker)
CANARY_KEY = "canary"


def plant_values() -> dict[str, str]:
    """Fresh values: nothing of an earlier test (or run) can be mistaken for them."""
    names = [
        "pwd", "access_key", "bearer", "authorization", "x_api_key", "camel", "client_secret",
        "named", "dsn_pw", "url_pw", "registered", "credential",
    ]  # fmt: skip
    values = {n: f"planted-{n.replace('_', '')}-{uuid.uuid4().hex}" for n in names}
    values[CANARY_KEY] = f"visible-canary-{uuid.uuid4().hex}"
    return values


def secret_values(planted: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in planted.items() if k != CANARY_KEY}


# -- the agent: every way a secret may travel towards the store -------------------------------
@kx.effect
def connect(
    dsn: str,
    *,
    pwd: str,
    access_key: str,
    bearer: str,
    client_secret: str,
    x_internal: str,
    headers: dict[str, str],
    note: str,
) -> dict[str, Any]:
    return {"connected": True, "note": note}


@kx.effect
def fetch_token(scope: str) -> dict[str, str]:
    """Returns a registered secret: the result is stored (and replayed) without it."""
    return {
        "scope": scope,
        "value": PLANTED["registered"],
        "text": f"issued {PLANTED['registered']}",
    }


@kx.effect
def call_api(url: str) -> None:
    raise PermissionError(f"{url} refused the key {PLANTED['registered']}")


def plant(run: kx.Run) -> None:
    p = PLANTED
    run.fact("api", p["credential"], kind="credential")
    connect(
        f"postgresql://app:{p['dsn_pw']}@db.example:5432/app",
        pwd=p["pwd"],
        access_key=p["access_key"],
        bearer=p["bearer"],
        client_secret=p["client_secret"],
        x_internal=p["named"],
        headers={
            "Authorization": f"Bearer {p['authorization']}",
            "X-Api-Key": p["x_api_key"],
            "accessKey": p["camel"],
            "Accept": p[CANARY_KEY],
        },
        note=f"{p[CANARY_KEY]} logged in with {p['credential']}",
    )
    fetch_token("read")
    with contextlib.suppress(PermissionError):  # the failure is recorded, the run goes on
        call_api(f"https://user:{p['url_pw']}@api.example/v1/items")


@kx.agent(name="secrets-planted")
def planted_agent(run: kx.Run, mode: str) -> None:
    for step in run.steps(["login", "bulk", "end"]):
        if step == "login":
            plant(run)
        elif step == "bulk":  # over 64 KiB: a side file in <store>.blobs/
            run.state["bulk"] = [PLANTED[CANARY_KEY]] * 3000
        elif mode == "fail":
            raise RuntimeError(
                f"gave up with {PLANTED['registered']} on "
                f"postgresql://app:{PLANTED['dsn_pw']}@db.example/app"
            )
        else:
            run.suspend("other", note=f"waiting for {PLANTED['registered']}")


# -- helpers ------------------------------------------------------------------------------------
@pytest.fixture
def planted() -> Iterator[dict[str, str]]:
    values = plant_values()
    PLANTED.clear()
    PLANTED.update(values)
    kx.secrets.register(values["registered"])
    kx.secrets.register(name="x_internal")
    yield values
    kx.secrets.forget(values["registered"])
    kx.secrets.forget(name="x_internal")
    PLANTED.clear()


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def leaks(paths: list[Path], planted: dict[str, str]) -> list[str]:
    """``file: name`` for every planted secret found in the bytes of a file."""
    found: list[str] = []
    for path in paths:
        data = path.read_bytes()
        found.extend(
            f"{path.name}: {name}"
            for name, value in secret_values(planted).items()
            if value.encode() in data
        )
    return found


def containing(paths: list[Path], text: str) -> list[str]:
    return [p.name for p in paths if text.encode() in p.read_bytes()]


# -- names and text ------------------------------------------------------------------------------
SECRET_NAMES = [
    "password", "Password", "PASSWD", "pwd", "db_pwd", "passphrase", "pass", "secret",
    "client_secret", "clientSecret", "AWS_SECRET_ACCESS_KEY", "token", "access_token",
    "refreshToken", "authtoken", "X-Auth-Token", "bearer", "api_key", "apikey", "apiKey",
    "X-Api-Key", "access_key", "accessKey", "private_key", "privateKey", "auth", "oauth",
    "basic_auth", "Authorization", "Proxy-Authorization", "cookie", "Set-Cookie", "session",
    "session_id", "sessionId", "credential", "credentials", "signature", "X-Amz-Signature",
]  # fmt: skip
ORDINARY_NAMES = [
    "max_tokens", "prompt_tokens", "tokenizer", "author", "authority", "passenger", "bypass",
    "key", "monkey", "keys", "idempotency_key", "amount", "user", "step_key",
]  # fmt: skip


@pytest.mark.parametrize("arg", SECRET_NAMES)
def test_names_that_hold_secrets(arg: str) -> None:
    assert is_secret_name(arg)


@pytest.mark.parametrize("arg", ORDINARY_NAMES)
def test_ordinary_names_are_kept(arg: str) -> None:
    assert not is_secret_name(arg)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://app:S3cr3t@db/app", "postgresql://app:***@db/app"),
        ("postgres://app:p@ss@db:5432/x?sslmode=require", "postgres://app:***@db:5432/x?sslmode=require"),
        ("https://user:pw123@host.example/path", "https://user:***@host.example/path"),
        ("redis://:hunter22@cache:6379/0", "redis://:***@cache:6379/0"),
        ("see 'mysql://root:toor@localhost/db' now", "see 'mysql://root:***@localhost/db' now"),
        ("https://host.example:8443/path", "https://host.example:8443/path"),
        ("host=db user=app password=S3cr3t dbname=x", "host=db user=app password=*** dbname=x"),
        ("GET /x?access_token=abc123&page=2", "GET /x?access_token=***&page=2"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: ***"),
        ("sent Bearer abc.def-ghi upstream", "sent Bearer *** upstream"),
        ("{'api_key': 'k-123', 'n': 1}", "{'api_key': ***, 'n': 1}"),
        ('{"password":"x1","user":"bob"}', '{"password":***,"user":"bob"}'),
        ("max_tokens=200, temperature: 0.2", "max_tokens=200, temperature: 0.2"),
        ("Error: connection refused", "Error: connection refused"),
    ],
)  # fmt: skip
def test_passwords_in_urls_dsns_and_pairs_are_masked(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


def test_registered_values_are_masked_and_never_shown() -> None:
    value = f"sk-live-{uuid.uuid4().hex}"
    assert kx.secrets.register(value) == value
    try:
        assert value in kx.secrets
        assert scrub_text(f"key={value}; again {value}!", heuristics=False) == (
            f"key={MASK}; again {MASK}!"
        )
        assert kx.secrets.scrub({"a": [f"x-{value}."], "token": "t"}) == {
            "a": [f"x-{MASK}."],
            "token": REDACTED,
        }
        assert value not in repr(kx.secrets)
    finally:
        kx.secrets.forget(value)
    assert value not in kx.secrets
    assert scrub_text(value) == value


def test_register_refuses_what_it_cannot_scrub_safely() -> None:
    with pytest.raises(ValueError, match="at least 8 characters"):
        kx.secrets.register("abc")
    with pytest.raises(ValueError, match=r"at least 8 characters.*register\(name='pin'\)"):
        kx.secrets.register("1424")  # a PIN: told apart from data only by its name
    with pytest.raises(ValueError, match="at least 8 characters"):
        kx.secrets.register("hunter2")
    assert "1424" not in kx.secrets and "hunter2" not in kx.secrets
    with pytest.raises(ValueError, match="at least 8 characters"):
        kx.secrets.register(1234)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"a value .* or a name"):
        kx.secrets.register()  # type: ignore[call-overload]


def test_with_nothing_registered_no_value_search_runs() -> None:
    if len(SECRETS) == 0:  # other tests of this process may have registered credentials
        assert SECRETS.pattern is None
    text = "a plain sentence with no anchors"
    assert scrub_text(text) is text


def test_kernelext_log_lines_are_scrubbed(
    planted: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("kernelext")
    with caplog.at_level(logging.INFO, logger="kernelext"):
        log.warning(
            "kernelext: retrying with %s on %s",
            planted["registered"],
            f"postgresql://app:{planted['dsn_pw']}@db/app",
        )
        try:
            raise RuntimeError(f"boom {planted['registered']}")
        except RuntimeError:
            log.exception("kernelext: failed")
    assert len(caplog.records) == 2
    text = caplog.text + "".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "postgresql://app:***@db/app" in text and "boom ***" in text
    assert not [n for n, v in secret_values(planted).items() if v in text]


# -- the store's files ---------------------------------------------------------------------------
def test_planted_secrets_are_in_no_file_the_store_wrote(
    store: Any, store_path: Path, planted: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    from kernelext._core.process.runtime import runtime

    with caplog.at_level(logging.DEBUG, logger="kernelext"):
        failed = planted_agent.start("fail", run_id="secrets-fail")
        assert failed.wait(WAIT) == "failed"
        suspended = planted_agent.start("suspend", run_id="secrets-suspend")
        assert suspended.wait(WAIT) == "suspended"
        logging.getLogger("kernelext").error("kernelext: %s", failed.error)

    # What the rows say (before the file is closed): masked, redacted, still useful.
    (row,) = [r for r in store.load_effects("secrets-fail").values() if r["tool"] == "connect"]
    args = json.loads(row["args"])
    assert args["dsn"] == "postgresql://app:***@db.example:5432/app"
    for name in ("pwd", "access_key", "bearer", "client_secret", "x_internal"):
        assert args[name] == REDACTED, name
    assert args["headers"]["Accept"] == planted[CANARY_KEY]
    assert {args["headers"][h] for h in ("Authorization", "X-Api-Key", "accessKey")} == {REDACTED}
    assert args["note"] == f"{planted[CANARY_KEY]} logged in with {MASK}"
    token = [r for r in store.load_effects("secrets-fail").values() if r["tool"] == "fetch_token"]
    assert json.loads(token[0]["result"]) == {
        "scope": "read",
        "value": MASK,
        "text": f"issued {MASK}",
    }
    refused = [r for r in store.load_effects("secrets-fail").values() if r["tool"] == "call_api"]
    assert refused[0]["error"] == (
        f"PermissionError: https://user:{MASK}@api.example/v1/items refused the key {MASK}"
    )
    run = store.get_run("secrets-fail")
    assert run["reason"].startswith(f"RuntimeError: gave up with {MASK} on postgresql://app:***@")
    assert any(MASK in (e["detail"] or "") for e in store.events("secrets-suspend"))

    runtime().settings.close()
    folder = store_path.parent
    files = files_under(folder)
    assert store_path in files
    side_files = [p for p in files if str(p).startswith(f"{store_path}.blobs")]
    assert side_files, files
    assert leaks(files, planted) == []
    # The grep sees what was written: the canary (an ordinary argument and state value)
    # is in the DuckDB file and in the side file.
    assert store_path.name in containing(files, planted[CANARY_KEY])
    assert containing(side_files, planted[CANARY_KEY])
    logged = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert "gave up with ***" in logged
    assert not [n for n, v in secret_values(planted).items() if v in logged]


def test_a_killed_workers_journal_holds_no_secret(tmp_path: Path, planted: dict[str, str]) -> None:
    """The worker runs while this process holds the store file, so its records stay in its
    journal; it is SIGKILLed before the journal is folded. The journal, then every file
    once the next open folded it, must hold none of the planted values."""
    from kernelext._store import open_store
    from kernelext._store.duckdb.handoff import HandoffLock

    path = tmp_path / "worker" / "kernelext.duckdb"
    path.parent.mkdir()
    stderr_path = tmp_path / "worker.stderr"
    paths = [str(Path(__file__).parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, KERNELEXT_STORE_WAIT="0.2", PYTHONPATH=os.pathsep.join(paths))
    env.pop("KERNELEXT_STORE", None)
    with open(stderr_path, "wb") as stderr:
        worker = subprocess.Popen(
            [sys.executable, __file__, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
    assert worker.stdin is not None and worker.stdout is not None
    lock = HandoffLock(str(path))
    try:
        worker.stdin.write(json.dumps(planted) + "\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "started", stderr_path.read_text()
        lock.acquire(timeout=WAIT)  # the worker hands the file over and goes on without it
        worker.stdin.write("go\n")
        worker.stdin.flush()
        assert worker.wait(120) == -signal.SIGKILL, stderr_path.read_text()
        journals = list(path.parent.glob(path.name + ".journal.*"))
        assert journals, "the killed worker left no journal"
        assert leaks(journals, planted) == []
        assert containing(journals, planted[CANARY_KEY]), "the journal holds the records"
    finally:
        lock.close()
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pipe in (worker.stdin, worker.stdout):
            pipe.close()

    store = open_store(str(path))  # folds the dead worker's journal
    try:
        tools = {r["tool"] for r in store.load_effects("secrets-worker").values()}
        assert {"connect", "fetch_token", "call_api"} <= tools
    finally:
        store.close()
    assert not list(path.parent.glob(path.name + ".journal.*"))
    files = files_under(path.parent)
    assert leaks(files, planted) == []
    assert path.name in containing(files, planted[CANARY_KEY])
    assert leaks([stderr_path], planted) == []


# -- the worker ------------------------------------------------------------------------------------
@kx.agent(name="secrets-worker")
def worker_agent(run: kx.Run) -> None:
    for step in run.steps(["a", "b", "c"]):
        if step == "a":
            print("started", flush=True)
            sys.stdin.readline()  # meanwhile the test takes the store file
        elif step == "b":
            plant(run)  # journaled, and durable once the step completed
        else:
            os.kill(os.getpid(), signal.SIGKILL)  # before anything folded the journal


def worker_main(store_path: str) -> None:
    from kernelext._store import open_store

    PLANTED.update(json.loads(sys.stdin.readline()))
    kx.secrets.register(PLANTED["registered"])
    kx.secrets.register(name="x_internal")
    store = open_store(store_path)
    worker_agent.start(run_id="secrets-worker", store=store).wait()
    print("not killed", flush=True)


if __name__ == "__main__":
    worker_main(sys.argv[1])


def test_a_result_replays_as_given_whatever_its_key_names() -> None:
    import json

    from kernelext._core.ledger.effect import stored_result

    answer = {
        "logprobs": [{"token": "Hello", "logprob": -0.1}],
        "session": "s-1",
        "access_token": "tok-123456",
        "password": "hunter22",
        "dsn": "postgresql://app:hunter22@db/app",
    }
    assert json.loads(stored_result(answer)) == answer  # only registered secrets are masked


# -- forms, reference counts, own identity (adversarial review of the scrubbing door) --------
def _registered(value: str | bytes) -> Iterator[None]:
    kx.secrets.register(value)
    try:
        yield
    finally:
        kx.secrets.forget(value)


registered = contextlib.contextmanager(_registered)


def _b64_at(k: int, encode: Any, s: str) -> str:
    """base64 of the secret inside other bytes, starting at offset ``k``."""
    return str(encode(b"\0" * k + s.encode() + b"\0" * k).decode())


@pytest.mark.parametrize(
    "encode",
    [
        lambda s: urllib.parse.quote_plus(s),
        lambda s: urllib.parse.urlencode({"q": s}),
        lambda s: ascii(s),
        lambda s: repr(s.encode()),
        lambda s: s.encode().hex(),
        lambda s: s.encode().hex().upper(),
        *[
            functools.partial(_b64_at, k, f)
            for k in range(3)
            for f in (base64.b64encode, base64.urlsafe_b64encode)
        ],
        lambda s: base64.b64encode(s.encode()).decode().rstrip("="),
        lambda s: base64.b64encode(b"ab" + s.encode()).decode(),
    ],
)
def test_escaped_and_encoded_forms_of_a_secret_are_masked(encode: Any) -> None:
    secret = f"pä ss/wörd+{uuid.uuid4().hex[:8]}"
    canary = f"kä ss/wörd+{uuid.uuid4().hex[:8]}"
    with registered(secret):
        text = f"sent {encode(secret)} and {encode(canary)}"
        clean = scrub_text(text, heuristics=False)
        assert encode(secret) not in clean and MASK in clean
        assert encode(canary) in clean  # a near miss is kept


def test_a_numeric_secret_in_json_numbers_never_reaches_the_text() -> None:
    from kernelext._core.encoding.secrets import StoreScrubber

    door = StoreScrubber()
    with registered("4111222233334444"):
        stored = door.json(
            json.dumps({"card": 4111222233334444, "f": [4111222233334444.0, 7], "ok": 1}),
            result=True,
        )
        assert "4111222233334444" not in stored
        assert json.loads(stored) == {"card": MASK, "f": [MASK, 7], "ok": 1}
        assert door.json("[4111222233334444", result=False) == "[***"  # not JSON: as text
        assert door.json("12", result=True) == "12"
    with registered("1234, 5678"):  # across JSON structure: no leaf holds it
        assert door.json(json.dumps([1234, 5678]), result=True) == json.dumps(MASK)


def test_forget_keeps_other_secrets_and_counts_registrations() -> None:
    b = f"p%20w%20d{uuid.uuid4().hex[:6]}"
    a = urllib.parse.unquote(b)  # a's URL-encoded form is b
    kx.secrets.register(b)
    kx.secrets.register(a)
    kx.secrets.forget(a)
    try:
        assert b in kx.secrets
        assert scrub_text(f"x {b} y", heuristics=False) == f"x {MASK} y"
        kx.secrets.register(a)
        kx.secrets.register(a)
        kx.secrets.forget(a)
        assert scrub_text(a, heuristics=False) == MASK  # registered twice: still scrubbed
        kx.secrets.forget(a)
        assert scrub_text(a, heuristics=False) == a
    finally:
        kx.secrets.forget(b)
        kx.secrets.forget(a)
    assert scrub_text(b, heuristics=False) == b


def test_register_refuses_a_value_of_this_processes_own_identity() -> None:
    from kernelext._store import actor

    with pytest.raises(ValueError, match="own identity"):
        kx.secrets.register(actor())  # user@host:pid (user@host may be under 8 characters)


def test_a_cut_error_text_keeps_no_start_of_a_secret() -> None:
    from kernelext._core.encoding.secrets import scrubbed_excerpt

    secret = f"EXPsecret-{uuid.uuid4().hex}"
    with registered(secret):
        text = "x" * 989 + " " + secret  # a whole token (a secret is matched as one)
        assert secret[:10] not in scrubbed_excerpt(text, 1000)
        assert secret[:10] in text[:1000]  # what cutting first would have kept


def test_an_exception_name_is_not_read_as_a_secret_pair() -> None:
    text = "SecretRefused: kernelext refuses to store runs.id"
    assert scrub_text(text) == text
    assert scrub_text("password: hunter22") == f"password: {MASK}"


def test_a_secret_is_masked_as_a_whole_token_not_inside_a_longer_number_or_word() -> None:
    from kernelext._core.encoding.secrets import StoreScrubber

    assert SECRETS.add("1424")  # a credential (a PIN): scrubbed from 4 characters on
    try:
        assert scrub_text("pin 1424, amount 142420, ref A1424", heuristics=False) == (
            f"pin {MASK}, amount 142420, ref A1424"
        )
        stored = StoreScrubber().json(json.dumps({"amount": 142420, "pin": 1424}), result=False)
        assert json.loads(stored) == {"amount": 142420, "pin": MASK}
    finally:
        SECRETS.forget("1424")
    secret = f"tok-{uuid.uuid4().hex[:12]}"
    with registered(secret):  # an encoded form is still found inside longer encoded text
        encoded = base64.b64encode(b"prefix:" + secret.encode()).decode()
        assert secret not in scrub_text(f"({secret})") and MASK in scrub_text(encoded)


def test_a_registered_secret_is_masked_even_glued_to_other_letters() -> None:
    """Whole tokens are for a credential's short text (a PIN inside an amount is data); a
    registered value (8 characters or more) glued to other text is still the value."""
    key = f"sk-live-{uuid.uuid4().hex[:20]}"
    short = f"t{uuid.uuid4().hex[:7]}"  # 8 characters: the least register takes
    pin = f"{uuid.uuid4().int % 10**7:07d}"  # a credential of 7: a whole token only
    assert SECRETS.add(pin)
    try:
        with registered(key), registered(short):
            assert key not in scrub_text(f"sig=abc{key}xyz")
            assert scrub_text(f"x{short}9") == f"x{MASK}9"
            assert scrub_text(f"amount 1{pin}, pin {pin}") == f"amount 1{pin}, pin {MASK}"
    finally:
        SECRETS.forget(pin)


def test_a_value_redacted_by_its_argument_name_never_reaches_a_stored_text(store: Any) -> None:
    """``api_key=...`` is shown ``***redacted***``; the call's error quoting it is stored, and
    shown in the runs overview, with the key masked too."""
    from kernelext._core.lifecycle.overview import read_overview

    key = f"sk-EFF-{uuid.uuid4().hex[:12]}"

    @kx.effect(name=f"charge_{uuid.uuid4().hex[:6]}")
    def charge(amount: int, api_key: str) -> None:
        raise RuntimeError(f"401 for key {api_key}")

    @kx.agent(name=f"charger-{uuid.uuid4().hex[:6]}")
    def charger(run: kx.Run) -> None:
        with run.step("charge"):
            charge(10, api_key=key)

    try:
        handle = charger.start()
        assert handle.wait(60) == "failed"
        (effect,) = store.load_effects(handle.run_id).values()
        texts = [str(effect["args"]), str(effect["error"]), str(store.get_run(handle.run_id))]
        texts += [row.text() for row in read_overview(store).rows]
        assert all(key not in text for text in texts), texts
        assert any("401 for key" in text for text in texts)  # the canary: the error is there
    finally:
        SECRETS.forget(key)
