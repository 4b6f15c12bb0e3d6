"""Watch a widget's text from inside the page, so that a brief state is never missed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .jupyterlab import WAIT_MS

__all__ = ["TextWatch"]

_WATCH_JS = """(el, [id, patterns]) => {
    const seen = (window.__kxWatch = window.__kxWatch || {})[id] = {};
    const check = () => {
        const text = el.innerText;
        for (const [name, pattern] of Object.entries(patterns)) {
            if (name in seen || !new RegExp(pattern, 'i').test(text)) continue;
            seen[name] = performance.now();
            requestAnimationFrame(() => { seen[name + ':frame'] = performance.now(); });
        }
    };
    el.addEventListener('click', event => {
        const button = event.target.closest('button');
        if (button) seen['click:' + button.innerText.trim()] ??= performance.now();
    }, true);
    new MutationObserver(check).observe(
        el, {subtree: true, childList: true, characterData: true, attributes: true});
    check();
}"""


class TextWatch:
    """Records, inside the page, when each pattern first appears in an element's text.

    A MutationObserver sees every change, so a state shown only briefly (a "stop
    pending" badge that lasts until the step ends) is never missed the way polling
    could miss it. Clicks on buttons inside the element are recorded as
    ``click:<label>``. Times are the page's ``performance.now()`` (ms); ``name:frame``
    is the next animation frame after ``name`` appeared, i.e. when it could be painted.
    """

    _ids = 0

    def __init__(self, element: Any, patterns: Mapping[str, str]) -> None:
        TextWatch._ids += 1
        self.id = f"w{TextWatch._ids}"
        self.page = element.page
        element.evaluate(_WATCH_JS, [self.id, dict(patterns)])

    def seen(self) -> dict[str, float]:
        found = self.page.evaluate(f"() => (window.__kxWatch || {{}})[{self.id!r}] || {{}}")
        return {str(k): float(v) for k, v in found.items()}

    def wait(self, name: str, timeout_ms: int = WAIT_MS) -> float:
        self.page.wait_for_function(
            f"() => ((window.__kxWatch || {{}})[{self.id!r}] || {{}})[{name!r}] !== undefined",
            timeout=timeout_ms,
        )
        return self.seen()[name]
