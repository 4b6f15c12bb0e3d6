"""``limit_stamps``: the send times ``kx.limit`` stamps, as each limit recorded them.

``Limit.stamp`` runs as it is, and the time it appended to its window is read back under
the limit's own (reentrant) lock, so no other call is stamped between. The times are the
limit's monotonic clock: a window check on them is exact, whatever a busy machine does
between a stamp and the request reaching a server.
"""

from __future__ import annotations

import pytest

from kernelext._core.ledger.limits import Limit, Slot

__all__ = ["limit_stamps"]


@pytest.fixture
def limit_stamps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    stamps: list[float] = []
    stamp = Limit.stamp

    def recorded(self: Limit, slot: Slot) -> None:
        with self._cond:
            before = len(self._sent)
            stamp(self, slot)
            if len(self._sent) > before:
                stamps.append(self._sent[-1])

    monkeypatch.setattr(Limit, "stamp", recorded)
    return stamps
