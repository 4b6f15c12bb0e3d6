"""One JupyterLab tab kept open from test to test, as a person keeps theirs.

Booting JupyterLab in a page costs Chromium 4 to 5 s of CPU (and the server the bundles it
sends), the largest single cost of the browser tests. A test's first notebook therefore
opens in the tab the previous test left, through the command a ``/lab/tree/PATH`` address
runs, ``filebrowser:open-path`` (the test server's ``LabApp.expose_app_in_browser`` puts
the app on ``window.jupyterapp``), when that tab is as a fresh one would be:

- the previous test ended without an error and ``put_away`` closed its documents before
  its kernels were shut down (no dialog about a dead kernel can come up);
- the tab shows JupyterLab of the same server, no dialog, menu or notification is open
  and none is counted in the status bar, the right sidebar is collapsed and no panel is
  open at the bottom, the theme is the light one a new home has, the server's Lab user
  settings are a new home's (a setting changed in the tab stays in its memory when the
  next home is reset), and nothing is left in the main area but the Launcher JupyterLab
  puts in an empty one (closed once the notebook is open, as a page loaded for it has
  none).

Otherwise (the first test, a test that raised, even after its notebook was put away, a test
of Notebook 7 or of a server of its own, a setting changed, a dialog, a menu, a
notification or a side panel left) the tab's context is closed and the notebook is loaded
in a new one, as before. Within a test, every later ``open_notebook`` loads the page.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["KeptTab", "not_kept", "opened_in_place", "put_away"]

_PUT_AWAY: set[int] = set()  # the pages ``put_away`` left ready for the next test's notebook
_KEEP: set[int] = set()  # the pages put away by the test now ending (taken as a test starts)
OPENED = {"in place": 0, "in a new tab": 0}  # how the tests' tabs came, for the record

_CLOSE_ALL = """() => {
    const app = window.jupyterapp;
    if (!app) return false;
    for (const widget of Array.from(app.shell.widgets('main'))) {
        if (widget.context) widget.context.model.dirty = false;  // no "save?" dialog
        widget.dispose();
    }
    return true;
}"""
_AS_NEW = """() => !!window.jupyterapp
    && document.querySelectorAll('.jp-Dialog, .Toastify__toast, .lm-Menu').length === 0
    && (document.querySelector('.jp-Notification-Status') || {innerText: '0'})
        .innerText.trim() === '0'
    && document.body.dataset.jpThemeLight === 'true'
    && window.jupyterapp.shell.rightCollapsed
    && Array.from(window.jupyterapp.shell.widgets('down')).length === 0
    && Array.from(window.jupyterapp.shell.widgets('main')).every(
        (widget) => widget.id.startsWith('launcher'))"""
_OPEN = """async (path) => {
    const app = window.jupyterapp;
    await app.commands.execute('filebrowser:open-path', {path});  // what /lab/tree/PATH runs
    for (const widget of Array.from(app.shell.widgets('main'))) {
        if (widget.id.startsWith('launcher')) widget.dispose();  // the one an empty area gets
    }
}"""


def _same_lab(page: Any, server: Any) -> bool:
    return str(page.url).startswith(f"{server.url}/lab")


def _settings_as_new(server: Any) -> bool:
    """The Lab user settings on the server are a new home's: a setting the test changed
    (the theme, a notebook option) stays in the tab's memory when the next home is reset."""
    from browser.jupyterlab import LAB_SETTINGS  # that module imports this one

    new = {}
    for path, values in LAB_SETTINGS.items():
        folder, file = path.rsplit("/", 1)
        new[f"{folder}:{file.removesuffix('.jupyterlab-settings')}"] = values
    listed = server.api("/lab/api/settings")["settings"]
    return all((item.get("settings") or {}) == new.get(item["id"], {}) for item in listed)


def put_away(page: Any, server: Any) -> None:
    """At the end of a test that passed: close every document in the tab (before its kernels
    are shut down); the tab is reused when it is then as a fresh one would be."""
    _PUT_AWAY.discard(id(page))
    with contextlib.suppress(Exception):  # a tab that cannot be put away is not reused
        closed = _same_lab(page, server) and page.evaluate(_CLOSE_ALL)
        if closed and page.evaluate(_AS_NEW) and _settings_as_new(server):
            _PUT_AWAY.add(id(page))
            _KEEP.add(id(page))


def not_kept(page: Any) -> None:
    """The test of ``page`` failed (maybe after ``put_away``): its tab is not reused."""
    _PUT_AWAY.discard(id(page))
    _KEEP.discard(id(page))


def opened_in_place(page: Any, server: Any, name: str) -> bool:
    """Open notebook ``name`` in the tab without loading the page, when the previous test
    put the tab away as a fresh one; False when the page must be loaded instead."""
    if id(page) not in _PUT_AWAY:
        return False
    _PUT_AWAY.discard(id(page))  # one open in place per put away
    if not _same_lab(page, server) or not page.evaluate(_AS_NEW):
        return False
    page.evaluate(_OPEN, server.path_of(name))
    OPENED["in place"] += 1
    return True


class KeptTab:
    """The pages of one Chromium, each test's page the previous one's when it was put away."""

    def __init__(self, browser: Any, width: int = 1400, height: int = 1000) -> None:
        self.browser, self.viewport = browser, {"width": width, "height": height}
        self._context: Any = None
        self._page: Any = None

    @contextlib.contextmanager
    def page(self, timeout_ms: int) -> Iterator[Any]:
        if self._page is None or id(self._page) not in _KEEP:
            self.close()
            self._context = self.browser.new_context(viewport=self.viewport)
            self._context.set_default_timeout(timeout_ms)
            self._page = self._context.new_page()
            OPENED["in a new tab"] += 1
        page = self._page
        _KEEP.discard(id(page))  # kept after this test only if this test puts it away
        try:
            yield page
        finally:
            if id(page) not in _KEEP:  # this test did not put it away: never reused
                self.close()

    def close(self) -> None:
        if self._context is not None:
            _PUT_AWAY.discard(id(self._page))
            _KEEP.discard(id(self._page))
            with contextlib.suppress(Exception):
                self._context.close()
        self._context = self._page = None
