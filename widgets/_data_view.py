"""Every value of an approval request's data arguments, in its card.

:class:`DataView`: one data argument (a numpy array, a pandas or Arrow table) as its summary
and a scrollable table of its rows, a page at a time (``PAGE`` rows), with Previous / Next
and a page number that reach every row (CSS class ``kernelext-data-view``).
:func:`data_box`: the views of a request's data arguments and how each differs from the
previously approved call of the tool, or None when it has none.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from kernelext._core.encoding.data_args import DataArgument, DataDiff, changes
from kernelext._core.people.approvals import Approval
from kernelext._shown import shown_html

__all__ = ["PAGE", "DataView", "data_box"]

PAGE = 200  # rows a page shows


class DataView(w.VBox):
    """One data argument, every row reachable: ``show(page)`` (from 0), or the buttons."""

    def __init__(self, data: DataArgument) -> None:
        self.data = data
        self.rows = list(data.table_rows())
        self.pages = max(1, -(-len(self.rows) // PAGE))
        self.page = 0
        self.title = w.HTML(
            f"<div><code>{shown_html(data.name)}</code>: {shown_html(data.summary())}</div>"
        )
        self.table = w.HTML(layout=w.Layout(max_height="320px", overflow="auto"))
        self.previous_button = w.Button(description="Previous", layout=w.Layout(width="auto"))
        self.next_button = w.Button(description="Next", layout=w.Layout(width="auto"))
        self.page_box = w.BoundedIntText(
            value=1, min=1, max=self.pages, description="page", layout=w.Layout(width="150px")
        )
        self.position = w.HTML()
        self.previous_button.on_click(lambda _b: self.show(self.page - 1))
        self.next_button.on_click(lambda _b: self.show(self.page + 1))
        self.page_box.observe(lambda change: self.show(int(change["new"]) - 1), names="value")
        pager = w.HBox([self.previous_button, self.page_box, self.next_button, self.position])
        children: list[Any] = [self.title]
        if not data.unseen:
            children += [self.table, pager] if self.pages > 1 else [self.table]
        super().__init__(children=children)
        self.add_class("kernelext-data-view")
        self.show(0)

    def page_rows(self, page: int) -> list[list[str]]:
        """The rows page ``page`` (from 0) shows."""
        return self.rows[page * PAGE : (page + 1) * PAGE]

    def show(self, page: int) -> None:
        page = min(max(page, 0), self.pages - 1)
        self.page = page
        first = page * PAGE
        shown = self.page_rows(page)
        head = "".join(f"<th>{shown_html(name)}</th>" for name in ["#", *self.data.header])
        body = "".join(
            f"<tr><td>{first + i + 1}</td>"
            + "".join(f"<td>{shown_html(cell)}</td>" for cell in row)
            + "</tr>"
            for i, row in enumerate(shown)
        )
        self.table.value = (
            f'<table class="kernelext-data-rows"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )
        last = first + len(shown)
        self.position.value = f"rows {first + 1:,}–{last:,} of {len(self.rows):,}"
        self.previous_button.disabled = page == 0
        self.next_button.disabled = page >= self.pages - 1
        if self.page_box.value != page + 1:
            self.page_box.value = page + 1


def changes_html(diffs: list[DataDiff], previous: Approval | None) -> str:
    if previous is None or not diffs:
        return ""
    lines = "".join(f"<li>{shown_html(diff.text())}</li>" for diff in diffs)
    return (
        f'<div class="kernelext-data-changes">Since the approved request '
        f"<code>{shown_html(str(previous.id))}</code> (run "
        f"<code>{shown_html(previous.run_id)}</code>):<ul>{lines}</ul></div>"
    )


def data_box(item: Approval) -> w.VBox | None:
    """The full views of ``item``'s data arguments and their changes; None without any."""
    data = item.data
    if not data:
        return None
    previous = item.previous
    views: list[Any] = [DataView(one) for one in data.values()]
    diffs = changes(previous.args, item.args) if previous is not None else []
    if diffs:
        views.append(w.HTML(changes_html(diffs, previous)))
    box = w.VBox(views)
    box.add_class("kernelext-data")
    return box
