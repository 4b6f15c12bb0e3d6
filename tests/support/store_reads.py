"""Counting the queries a store runs: what a panel's looks cost."""

from __future__ import annotations

from typing import Any

import pytest


class Reads:
    """Counts the queries the store runs (each read of each kind goes through one of these)."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for method in ("read", "_read_with_names", "read_arrow"):
            original = getattr(store, method)

            def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.count += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(store, method, counted)
