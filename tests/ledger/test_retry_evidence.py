"""A failed connection proves a request never left only when it was the call's only one.

A POST applied by the target and answered with a redirect (``303``/``307``) to a host that
is down (or a name that does not resolve) fails with the same error as a POST whose
connection was refused. Against a real local HTTP server (127.0.0.1) that counts its
deliveries, with urllib, requests and httpx, in a plain, an async and a batch effect:
each such call is delivered once and recorded ``unknown``, never made again. A resume of
a failed key-less call that may have reached its target waits for a person too.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import requests
from support.http_server import DeliveryServer
from support.live import name

import kernelext as kx
from kernelext._core.ledger.evidence import Evidence, proves_not_sent
from kernelext._store import Store

WAIT = 60.0
UNRESOLVABLE = "http://nothing-here.invalid/done"  # a reserved name: never resolves

pytestmark = pytest.mark.both_backends


def by_urllib(url: str) -> Any:
    body = json.dumps({"amount": 5}).encode()
    request = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def by_requests(url: str) -> Any:
    response = requests.post(url, json={"amount": 5}, timeout=10)
    response.raise_for_status()
    return response.json()


def by_httpx(url: str) -> Any:
    response = httpx.post(url, json={"amount": 5}, timeout=10, follow_redirects=True)
    response.raise_for_status()
    return response.json()


CLIENTS: dict[str, Callable[[str], Any]] = {
    "urllib": by_urllib,
    "requests": by_requests,
    "httpx": by_httpx,
}
# urllib follows a 303 after a POST (as a GET), not a 307; requests and httpx both.
REDIRECTS = [("urllib", 303), ("requests", 303), ("requests", 307), ("httpx", 303)]
REDIRECTS += [("httpx", 307)]


def rows_of(run_id: str) -> list[tuple[str, int | None]]:
    rows = kx.sql("select status, attempts from effects where run_id = ?", [run_id])
    pairs = zip(rows["status"], rows["attempts"], strict=True)
    return [(str(s), None if a != a else int(a)) for s, a in pairs]  # NaN: NULL


@pytest.mark.parametrize("target", ["down", "unresolvable"])
@pytest.mark.parametrize(("client", "status"), REDIRECTS)
def test_a_post_redirected_to_a_host_that_is_down_is_delivered_once_and_unknown(
    store: Store,
    delivery_server: DeliveryServer,
    closed_url: str,
    client: str,
    status: int,
    target: str,
) -> None:
    location = closed_url + "/done" if target == "down" else UNRESOLVABLE
    delivery_server.fail_next(1, status, delivered=True, location=location)
    send = CLIENTS[client]

    @kx.effect(name="pay", retries=3)
    def pay() -> Any:
        return send(delivery_server.url + "/pay")

    @kx.agent(name=name("redirected"))
    def redirected(run: kx.Run) -> Any:
        return pay()

    handle = redirected.start()
    assert handle.wait(WAIT) == "needs_decision", handle.error
    assert delivery_server.count() == 1  # applied once, never sent again
    assert rows_of(handle.run_id) == [("unknown", 1)]
    (unknown,) = kx.reconcile(handle.run_id)
    assert "a connection failed after the call had made another" in unknown.row["error"]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_connection_refused_with_no_other_is_still_made_again(
    store: Store, closed_url: str, client: str
) -> None:
    """The other side of the rule: a call whose only connection was refused never left,
    and is made again (then fails, never sent): the evidence does not over-reach."""
    send, url = CLIENTS[client], closed_url + "/done"

    @kx.effect(name="pay", retries=2)
    def pay() -> Any:
        return send(url)

    @kx.agent(name=name("refused"))
    def refused(run: kx.Run) -> Any:
        return pay()

    handle = refused.start()
    assert handle.wait(WAIT) == "failed", handle.error
    assert rows_of(handle.run_id) == [("failed", 3)]


def test_an_async_effect_redirected_to_a_host_that_is_down_is_unknown(
    store: Store, delivery_server: DeliveryServer, closed_url: str
) -> None:
    delivery_server.fail_next(1, 307, delivered=True, location=closed_url + "/done")

    @kx.effect(name="apay")
    async def apay() -> Any:
        async with httpx.AsyncClient(timeout=10, follow_redirects=True) as session:
            response = await session.post(delivery_server.url + "/pay", json={"amount": 5})
            return response.status_code

    @kx.agent(name=name("async-redirected"))
    async def redirected(run: kx.Run) -> Any:
        return await apay()

    handle = redirected.start()
    assert handle.wait(WAIT) == "needs_decision", handle.error
    assert delivery_server.count() == 1
    assert rows_of(handle.run_id) == [("unknown", None)]  # not failed: a resume would send


def test_a_batch_item_redirected_to_a_host_that_is_down_is_delivered_once(
    store: Store, delivery_server: DeliveryServer, closed_url: str
) -> None:
    delivery_server.fail_next(2, 307, delivered=True, location=closed_url + "/done")

    @kx.effect(name="pay", retries=2)
    def pay(item: int) -> Any:
        return by_requests(f"{delivery_server.url}/pay/{item}")

    @kx.agent(name=name("mapped"))
    def mapped(run: kx.Run) -> Any:
        return run.map(pay, [1, 2], concurrency=2)

    handle = mapped.start()
    assert handle.wait(WAIT) == "needs_decision", handle.error
    assert delivery_server.count() == 2  # each item once
    assert rows_of(handle.run_id) == [("unknown", 1), ("unknown", 1)]


def test_a_resume_does_not_send_again_a_call_answered_500(
    store: Store, delivery_server: DeliveryServer
) -> None:
    """``retry=True`` asks again a failed call, but not a key-less one answered after its
    request left: on resume it waits as unknown for kx.reconcile."""
    delivery_server.fail_next(1, 500, delivered=True)

    @kx.effect(name="pay", retry=True)
    def pay() -> Any:
        return by_requests(delivery_server.url + "/pay")

    @kx.agent(name=name("answered-500"))
    def answered(run: kx.Run) -> Any:
        return pay()

    handle = answered.start()
    assert handle.wait(WAIT) == "failed", handle.error
    assert delivery_server.count() == 1
    resumed = kx.resume(handle.run_id)
    assert resumed.wait(WAIT) == "needs_decision", resumed.error
    assert "retry=True does not make it again" in str(resumed.info().get("reason")), resumed.info()
    assert delivery_server.count() == 1
    assert rows_of(handle.run_id) == [("unknown", 1)]
    (unknown,) = kx.reconcile(handle.run_id)  # listed for a person to decide
    assert "500" in unknown.row["error"]


def test_a_resume_makes_again_a_failed_call_that_never_left(store: Store, closed_url: str) -> None:
    """What ``retry=True`` still asks again: a call whose only connection was refused."""
    url = closed_url + "/done"

    @kx.effect(name="pay", retry=True)
    def pay() -> Any:
        return by_requests(url)

    @kx.agent(name=name("never-left"))
    def never_left(run: kx.Run) -> Any:
        return pay()

    handle = never_left.start()
    assert handle.wait(WAIT) == "failed", handle.error
    resumed = kx.resume(handle.run_id)
    assert resumed.wait(WAIT) == "failed", resumed.error
    assert rows_of(handle.run_id) == [("failed", 2)]  # made again on resume, counted


def test_a_connection_error_with_no_connection_seen_is_not_proven_unsent(store: Store) -> None:
    """A tool that reports a refused connection it was not seen making (its own thread, a
    C extension, or a plain raise) proves nothing: made once, and unknown."""

    @kx.effect(name="pay", retries=3)
    def pay() -> Any:
        raise ConnectionRefusedError("connection refused")

    @kx.agent(name=name("unseen"))
    def unseen(run: kx.Run) -> Any:
        return pay()

    handle = unseen.start()
    assert handle.wait(WAIT) == "needs_decision", handle.error
    assert rows_of(handle.run_id) == [("unknown", 1)]


# The rule of kernelext._core.ledger.evidence, case by case: (what the call did, proven unsent?).
LOCAL, OTHER = ("127.0.0.1", 8001), ("127.0.0.1", 8002)
EVIDENCE_CASES = [
    (Evidence(connects=[LOCAL]), True),  # its one connection, refused
    (Evidence(lookups=["api.example"]), True),  # its one lookup, failed
    (Evidence(lookups=["api.example"], connects=[("::1", 8001), LOCAL]), True),  # one name
    (Evidence(connects=[LOCAL, LOCAL]), True),  # the same address twice (a connect retry)
    (Evidence(), False),  # nothing seen
    (Evidence(sent=True, connects=[LOCAL]), False),  # a request went out first
    (Evidence(connects=[LOCAL, OTHER]), False),  # a redirect to another port
    (Evidence(connects=[LOCAL, ("10.0.0.9", 8001)]), False),  # two addresses, no lookup
    (Evidence(lookups=["a.example", "b.example"]), False),  # two names
]


@pytest.mark.parametrize(("evidence", "proven"), EVIDENCE_CASES)
def test_what_proves_a_refused_connection_never_sent(evidence: Evidence, proven: bool) -> None:
    refused: list[BaseException] = [ConnectionRefusedError("refused")]
    assert proves_not_sent(evidence, refused) is proven


def test_a_dns_failure_after_a_connection_is_not_proven_unsent() -> None:
    failed_lookup: list[BaseException] = [socket.gaierror(-2, "Name or service not known")]
    assert proves_not_sent(Evidence(lookups=["api.example"]), failed_lookup)
    assert not proves_not_sent(Evidence(connects=[LOCAL]), failed_lookup)  # after a connect
