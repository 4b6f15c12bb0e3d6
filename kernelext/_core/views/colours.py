"""The colours every view of a run uses: the panel, the timeline SVG, the resume plan, the
approvals and question cards, the fact table.

A run status, a step status, an effect status and a fact's check status each have one
colour here; the few words of mood (fine, wrong, warning, quiet) too. Views look colours
up here and keep none of their own, so the same status has the same colour everywhere.
"""

from __future__ import annotations

from ...status import EffectStatus, Status, StepStatus

__all__ = [
    "BAD",
    "BATCH_COLOURS",
    "BORDER",
    "CHECK_COLOURS",
    "EFFECT_COLOURS",
    "GREY",
    "MUTED",
    "OK",
    "PAPER",
    "REQUEST_COLOURS",
    "RUN_COLOURS",
    "RUN_TINTS",
    "STEP_COLOURS",
    "THEME",
    "WARN",
    "colour_of",
]

# mood
OK = "#1a7f37"  # done, applied, ready
BAD = "#cf222e"  # failed, blocked, an error to read
WARN = "#9a6700"  # stale, changed, overdue soon
MUTED = "#57606a"  # secondary text, "none"
BORDER = "#d0d7de"  # frames of cards and panels
PAPER = "#f6f8fa"  # the background of a code block or a cut stretch
GREY = "#8c959f"  # a status without a colour of its own

# What follows the page's light or dark theme: JupyterLab's CSS variables, each with the
# light colour as its fallback so that HTML shown elsewhere (nbconvert, a browser) reads
# the same. For CSS ``style`` values only (an SVG attribute takes no variable).
THEME: dict[str, str] = {
    "text": "var(--jp-ui-font-color1, #1f2328)",
    "muted": "var(--jp-ui-font-color2, #57606a)",
    "faint": "var(--jp-ui-font-color3, #8c959f)",
    "paper": "var(--jp-layout-color1, #ffffff)",
    "paper2": "var(--jp-layout-color2, #f6f8fa)",
    "border": "var(--jp-border-color2, #d0d7de)",
    "warn_paper": "var(--jp-warn-color3, #fff8c5)",
    "warn_border": "var(--jp-warn-color1, #d4a72c)",
    "font": "var(--jp-ui-font-family, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif)",
    "size": "var(--jp-ui-font-size1, 13px)",
    "code_size": "var(--jp-code-font-size, 12px)",
}

# run status -> colour (text, badges, frames)
RUN_COLOURS: dict[str, str] = {
    Status.RUNNING: "#1f6feb",
    Status.STOPPING: "#bf8700",
    Status.SUSPENDED: "#8250df",
    Status.COMPLETED: OK,
    Status.FAILED: BAD,
    Status.NEEDS_DECISION: "#d1242f",
    Status.EXPIRED: "#6e7781",
    Status.CANCELLED: "#6e7781",
}
# run status -> a light tint of its colour (the timeline's status bands)
RUN_TINTS: dict[str, str] = {
    Status.RUNNING: "#ddf4ff",
    Status.STOPPING: "#fff1a8",
    Status.SUSPENDED: "#eddcff",
    Status.NEEDS_DECISION: "#ffd8d3",
}
# step status -> colour (the timeline's step bars)
STEP_COLOURS: dict[str, str] = {
    StepStatus.COMPLETED: "#2da44e",
    StepStatus.RUNNING: RUN_COLOURS[Status.RUNNING],
    StepStatus.FAILED: BAD,
    StepStatus.CANCELLED: GREY,
    StepStatus.ABANDONED: BORDER,
}
# effect status -> colour (the timeline's effect ticks, the plan's and cards' effects)
EFFECT_COLOURS: dict[str, str] = {
    EffectStatus.APPLIED: OK,
    EffectStatus.PENDING: RUN_COLOURS[Status.STOPPING],
    EffectStatus.FAILED: BAD,
    EffectStatus.UNKNOWN: "#bf3989",
    EffectStatus.NOT_APPLIED: GREY,
    EffectStatus.GIVEN_UP: GREY,
}
# what a run waits for a person on -> colour (the approval and question cards, the
# timeline's "asked" lane)
REQUEST_COLOURS: dict[str, str] = {
    "approval": RUN_COLOURS[Status.STOPPING],
    "question": "#0969da",
}
# a batch's items -> colour (the panel's batch bar; its track is BORDER)
BATCH_COLOURS: dict[str, str] = {
    "done": STEP_COLOURS[StepStatus.COMPLETED],
    StepStatus.FAILED: STEP_COLOURS[StepStatus.FAILED],
    "waiting": RUN_COLOURS[Status.SUSPENDED],
    "in_flight": STEP_COLOURS[StepStatus.RUNNING],
}
# a fact's last check -> colour (the revalidation table)
CHECK_COLOURS: dict[str, str] = {
    "ok": OK,
    "accepted": OK,
    "refreshed": OK,
    "changed": RUN_COLOURS[Status.NEEDS_DECISION],
    "error": RUN_COLOURS[Status.NEEDS_DECISION],
    "timeout": RUN_COLOURS[Status.STOPPING],
    "unresolved": RUN_COLOURS[Status.STOPPING],
}


def colour_of(table: dict[str, str], status: str | None, default: str = MUTED) -> str:
    """The colour of ``status`` in ``table`` (one of the tables above), else ``default``."""
    return table.get(str(status), default) if status is not None else default
