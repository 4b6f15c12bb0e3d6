"""A pytest plugin that writes each test's CPU (its own and its reaped children's) as JSON
lines, one file per xdist worker: where the suite's time goes on a machine it saturates.

    PYTHONPATH=tests CPU_USE_OUT=/tmp/cpu_use PYTEST_ADDOPTS='-p support.cpu_use' make test

Each line: ``id``, ``wall``, ``self`` and ``kids`` (seconds of user + system CPU), ``t`` (when
the test ended). A child's CPU counts once it is reaped: a module's server lands on the test
whose teardown stops it, a session's on the worker's last test.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator

import pytest

OUT = os.environ.get("CPU_USE_OUT", "cpu_use")


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    began, (me, kids) = time.monotonic(), _cpu()
    yield
    me_after, kids_after = _cpu()
    line = {
        "id": item.nodeid,
        "wall": time.monotonic() - began,
        "self": me_after - me,
        "kids": kids_after - kids,
        "t": time.time(),
    }
    os.makedirs(OUT, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(OUT, f"{worker}.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
