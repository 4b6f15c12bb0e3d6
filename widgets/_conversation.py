"""The panel's line for a run of model and tool calls: the last exchange, scrubbed.

The counts (turns, tool calls, tokens, cost) are the panel's progress text
(:meth:`PanelView.progress_text`); this adds what was said or called last.
"""

from __future__ import annotations

from kernelext._core.views.colours import MUTED
from kernelext._shown import shown_html

from ._render import PanelView

__all__ = ["conversation_html"]


def conversation_html(view: PanelView) -> str:
    """``<div>last: assistant asked for lookup_order</div>``, or "" for other runs."""
    talk = view.conversation
    if talk is None or not talk.last:
        return ""
    return (
        f'<div class="kernelext-conversation"><span style="color:{MUTED}">last:</span> '
        f"{shown_html(talk.last)}</div>"
    )
