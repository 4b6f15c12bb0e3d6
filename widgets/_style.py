"""How the panel and its add-ons look: one style sheet, in JupyterLab's theme variables.

Every text is at least 11 px; colours follow the light or dark JupyterLab theme (each
variable falls back to the light colour outside JupyterLab). :data:`PANEL_STYLE` is the
``<style>`` the live panel carries (it applies to ``.kernelext-panel`` only),
:data:`RUNS_STYLE` the overview's (``.kernelext-runs``: ``kx.runs()`` in a notebook);
:func:`muted_html` is a line of secondary text.
"""

from __future__ import annotations

from kernelext._core.views.colours import THEME
from kernelext._shown import shown_html

__all__ = ["FRAME", "PANEL_STYLE", "RUNS_STYLE", "muted_html"]

FRAME = f"1px solid {THEME['border']}"

PANEL_STYLE = f"""<style>
.kernelext-panel {{
  font-family: {THEME["font"]}; font-size: {THEME["size"]}; color: {THEME["text"]};
  background: {THEME["paper"]}; border-radius: 6px; line-height: 1.45;
}}
.kernelext-panel .widget-html, .kernelext-panel .widget-html-content {{
  font-size: {THEME["size"]}; color: {THEME["text"]}; line-height: 1.45;
}}
.kernelext-panel .widget-html-content {{ white-space: normal; }}
.kernelext-panel code {{
  font-size: {THEME["code_size"]}; background: {THEME["paper2"]};
  padding: 0 3px; border-radius: 3px;
}}
.kernelext-panel .kernelext-muted {{ color: {THEME["muted"]}; }}
.kernelext-panel table {{ border-collapse: collapse; }}
.kernelext-panel th, .kernelext-panel td {{
  text-align: left; padding: 1px 8px 1px 0; vertical-align: top;
}}
.kernelext-panel .kernelext-buttons {{ margin: 4px 0; }}
.kernelext-panel .kernelext-timeline-live svg text {{ font-size: 11px; }}
.kernelext-panel .p-Collapse-header, .kernelext-panel .jupyter-widget-Collapse-header,
.kernelext-panel .lm-Collapse-header {{
  font-size: {THEME["size"]}; color: {THEME["text"]}; background: {THEME["paper2"]};
  padding: 3px 8px;
}}
</style>"""

RUNS_STYLE = f"""<style>
.kernelext-runs {{
  font-family: {THEME["font"]}; font-size: {THEME["size"]}; color: {THEME["text"]};
  background: {THEME["paper"]}; border-radius: 6px; line-height: 1.45;
}}
.kernelext-runs .widget-html, .kernelext-runs .widget-html-content {{
  font-size: {THEME["size"]}; color: {THEME["text"]}; line-height: 1.45;
}}
.kernelext-runs .widget-html-content {{ white-space: normal; }}
.kernelext-runs code {{
  font-size: {THEME["code_size"]}; background: {THEME["paper2"]};
  padding: 0 3px; border-radius: 3px;
}}
.kernelext-runs .kernelext-runs-grid > .widget-html {{
  border-top: 1px solid {THEME["border"]}; margin: 0; padding: 2px 0;
}}
.kernelext-runs .kernelext-runs-head .widget-html-content {{
  color: {THEME["muted"]}; font-weight: 600;
}}
.kernelext-runs .kernelext-row-actions {{ border-top: 1px solid {THEME["border"]}; }}
.kernelext-runs table {{ border-collapse: collapse; }}
.kernelext-runs th, .kernelext-runs td {{
  text-align: left; padding: 2px 10px 2px 0; vertical-align: top;
  border-top: 1px solid {THEME["border"]};
}}
</style>"""


def muted_html(text: str) -> str:
    """One line of secondary text (escaped)."""
    return f'<div class="kernelext-muted" style="color:{THEME["muted"]}">{shown_html(text)}</div>'
