"""The banner an expired run shows: why and when it expired, and a Restart button.

``ExpiredBanner(handle)`` is hidden while the run is not ``expired`` and appears once
the sweeper expired it (call :meth:`ExpiredBanner.refresh`, or let the control panel
embed it and refresh it with its own redraws). **Restart** calls ``kx.restart`` on
the run: a new run starts from the kept snapshot, without repeating what the old one
did; ``on_restart(new_handle)`` lets a panel follow the new run.

:func:`expired_addon` is its control-panel add-on (installed with the others by
``widgets/_addons.py``), so every control panel carries the banner (and follows the
restarted run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as w

from kernelext._core.lifecycle.expiry import expiry_info
from kernelext._core.lifecycle.restart import restart
from kernelext._core.views.colours import RUN_COLOURS
from kernelext._formatting import moment_text
from kernelext._shown import shown_html, shows
from kernelext.status import Status

__all__ = ["ExpiredBanner", "banner_text", "expired_addon"]

SOURCE = "panel"


def banner_text(info: dict[str, Any]) -> str:
    """One line for an expired run: reason, when, and until when it can be restarted."""
    text = f"Run {info['run_id']} expired ({info['reason']})"
    if info.get("expired_at") is not None:
        text += f" at {moment_text(info['expired_at'])}"
    if info.get("removed_at") is not None:
        text += f"; its snapshot was removed at {moment_text(info['removed_at'])}"
    elif info.get("kept_until") is not None:
        text += f"; its snapshot is kept until {moment_text(info['kept_until'])}"
    if info.get("restarts"):
        text += "; restarted as " + ", ".join(info["restarts"])
    return text + "."


class ExpiredBanner(w.VBox):
    """Says that a run expired and offers to restart it from its kept snapshot."""

    def __init__(
        self,
        handle: Any,
        *,
        on_restart: Callable[[Any], Any] | None = None,
        restart_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.handle = handle
        self.on_restart = on_restart
        self.restart_kwargs = dict(restart_kwargs or {})
        self.new_handle: Any = None
        self.message = w.HTML()
        self.notice = w.HTML()
        self.restart_button = w.Button(
            description="Restart",
            icon="refresh",
            button_style="info",
            tooltip="Start a new run from the kept snapshot (kx.restart)",
            layout=w.Layout(width="auto"),
        )
        self.restart_button.on_click(self._on_restart)
        super().__init__(
            children=[w.HBox([self.message, self.restart_button]), self.notice],
            layout=w.Layout(
                border=f"1px solid {RUN_COLOURS[Status.EXPIRED]}", padding="2px 8px", margin="4px 0"
            ),
        )
        self.add_class("kernelext-expired")
        self.info: dict[str, Any] = {}
        self.refresh()

    @property
    def run_id(self) -> str:
        return str(self.handle.run_id)

    def refresh(self) -> dict[str, Any]:
        """Redraw from the store; the banner shows only while the run is expired."""
        if getattr(self.handle, "alive", False):  # executing here: cannot be expired
            self.layout.display = "none"
            return self.info
        self.info = expiry_info(self.run_id, store=self.handle.store)
        expired = self.info["status"] == Status.EXPIRED
        self.layout.display = None if expired else "none"
        self.message.value = (
            f'<div style="color:{RUN_COLOURS[Status.EXPIRED]}"><b>expired</b> · '
            f"{shown_html(banner_text(self.info))}</div>"
            if expired
            else ""
        )
        self.restart_button.disabled = (
            not expired or self.info["removed_at"] is not None or self.new_handle is not None
        )
        return self.info

    def _on_restart(self, _button: Any = None) -> None:
        self.restart_button.disabled = True
        try:
            new = restart(
                self.run_id, store=self.handle.store, source=SOURCE, **self.restart_kwargs
            )
        except Exception as exc:  # the banner says what went wrong, e.g. reconcile first
            self.notice.value = (
                f"<div>{shown_html(type(exc).__name__)}: {shown_html(str(exc))}</div>"
            )
            self.refresh()
            return
        self.new_handle = new
        self.notice.value = (
            f"<div>restarted as <code>{shown_html(new.run_id)}</code> from the kept snapshot</div>"
        )
        if self.on_restart is not None:
            self.on_restart(new)
        self.refresh()

    @shows
    def __repr__(self) -> str:
        if self.info.get("status") == Status.EXPIRED:
            return banner_text(self.info)
        return f"<kernelext expired banner for {self.run_id} (run is {self.info.get('status')})>"


def expired_addon(panel: Any) -> ExpiredBanner:
    """A ``PANEL_ADDONS`` factory: the banner of the panel's run; Restart makes the panel
    follow the new run."""
    return ExpiredBanner(panel.handle, on_restart=panel.follow)
