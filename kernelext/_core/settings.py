"""``SETTINGS`` and ``get_store``, the names older code imports.

``SETTINGS`` stands for the settings of whichever runtime is current when it is used
(read or set), so it stays right across ``use_runtime``. New code calls
``runtime().settings`` and ``runtime.get_store`` (see ``core/runtime.py``).
"""

from __future__ import annotations

from typing import Any, cast

from .runtime import Settings, get_store, runtime

__all__ = ["SETTINGS", "Settings", "get_store"]


class _CurrentSettings:
    """Every attribute read or set goes to ``runtime().settings`` at that moment."""

    def __getattr__(self, name: str) -> Any:
        return getattr(runtime().settings, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(runtime().settings, name, value)

    def __repr__(self) -> str:
        return f"<SETTINGS of {runtime()!r}>"


SETTINGS = cast(Settings, _CurrentSettings())
