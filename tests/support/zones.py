"""A reader's time zone for a test: ``in_zone("Europe/Paris")`` sets ``TZ`` for this process
(and the kernels and commands it starts) and puts the zone back afterwards."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator


@contextlib.contextmanager
def in_zone(name: str) -> Iterator[None]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()
