"""What ``kx.runs()`` returns: the table people query, which a notebook shows live.

Design: ``kx.runs()`` stays a pandas DataFrame (``kx.runs()["status"]``,
``len(kx.runs())``, ``.set_index("id").loc[...]``, ``==``, pickling: all as before), of a
subclass, :class:`RunsFrame`, that changes one thing: how a notebook *displays* it. With
``%load_ext kernelext`` its ``_repr_mimebundle_`` asks the runtime's ``runs_renderer``
(filled by the extension, like ``handle_renderer``) for the live overview widget
(``kernelext.widgets._runs``: statuses, progress, time left, what each run waits for,
Stop / Force stop through the notebook server, a way to open each run's panel) plus a
``text/html`` copy for saved notebooks and the table's own ``text/plain``. Without the
extension, or outside a notebook, it returns nothing and IPython shows the plain table,
exactly as before. The subclass adds no column and no method a user calls.

Why a subclass and not a new function or a widget with a ``.frame``: existing code and
tests index, filter and count the result, so its type and contents must not change; a
second function (``kx.runs_overview()``) would not make the call people already type
show the live view, which is what the design asks (``kx.runs()`` in a notebook is the live
overview). The risk of a DataFrame subclass is that it leaks into derived frames:
``_constructor`` is ``pandas.DataFrame``, so ``kx.runs().head()``, a filter, a copy or a
merge is a plain DataFrame that displays as a table; only the frame ``kx.runs()``
returned displays live. Pickled, it is a plain DataFrame (it must not carry the store).
Without pandas ``kx.runs()`` is a pyarrow Table, as before, and shows as one.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..._shown import shown_frame
from .runtime import runtime

__all__ = ["RunsFrame", "ShownFrame", "runs_frame", "shown_table"]


class ShownFrame(pd.DataFrame):  # type: ignore[misc]  # pandas ships no types
    """A DataFrame (``kx.sql()``'s, ``kx.runs()``'s) whose values are as stored, for code,
    and whose ``repr`` and HTML pass the display door; what it derives is a plain table."""

    @property
    def _constructor(self) -> Any:
        return pd.DataFrame  # what it derives is a plain table

    @classmethod
    def _from_arrays(cls, *args: Any, **kwargs: Any) -> Any:
        return pd.DataFrame._from_arrays(*args, **kwargs)  # transpose and the like: plain

    def __repr__(self) -> str:  # the table through the display door (kernelext._shown)
        return repr(shown_frame(pd.DataFrame(self)))

    def _repr_html_(self) -> str | None:
        return shown_frame(pd.DataFrame(self))._repr_html_()  # type: ignore[no-any-return]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return shown_table, (pd.DataFrame(self),)  # unpickled: one again


class RunsFrame(ShownFrame):
    """A DataFrame of ``kx.runs()``; displayed with the extension loaded, the live overview."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        return pd.DataFrame, (pd.DataFrame(self),)  # unpickled: a plain DataFrame (no store)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        renderer = runtime().settings.runs_renderer
        if renderer is None:
            return None  # IPython shows the table as any DataFrame
        return renderer(self)

    @property
    def overview_of(self) -> tuple[Any, str | None]:
        """(the store, the status) the frame was read with: what its overview shows."""
        return self.__dict__.get("_kx_store"), self.__dict__.get("_kx_status")


def runs_frame(frame: Any, *, store: Any, status: str | None) -> Any:
    """``frame`` (``kx.runs``' table) as a :class:`RunsFrame` sharing its data."""
    if type(frame) is not pd.DataFrame:
        return frame
    runs = RunsFrame(frame)
    # Plain attributes, not pandas metadata: never copied to derived frames nor pickled.
    object.__setattr__(runs, "_kx_store", store)
    object.__setattr__(runs, "_kx_status", status)
    return runs


def shown_table(frame: Any) -> Any:
    """``frame`` (``kx.sql``'s table) as a :class:`ShownFrame` sharing its data."""
    return ShownFrame(frame) if type(frame) is pd.DataFrame else frame
