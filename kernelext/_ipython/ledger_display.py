"""How a ``%%ledger`` table reads in a notebook: a NULL shows empty, a whole number whole.

``kx.sql`` gives the database's values as pandas makes them: NULL becomes ``NaN`` (or
``None``, ``NaT``), and an integer column with a NULL in it becomes floats (``12.0``).
The magic returns the same frame with only its display changed: a NULL cell is empty
and such a column shows its whole numbers (``12``). The values, dtypes and every frame
computed from it are pandas' own.
"""

from __future__ import annotations

import functools
from typing import Any

from .._shown import shown_frame

__all__ = ["for_display", "shown"]


def _whole_numbers_with_nulls(column: Any) -> bool:
    """A float column that pandas made from integers because of a NULL in it."""
    if column.dtype.kind != "f":
        return False
    import numpy as np

    present = column.dropna()
    return (
        len(present) < len(column)
        and bool(np.isfinite(present.to_numpy()).all())  # inf stays a float
        and bool((present == present.round()).all())
    )


def shown(frame: Any) -> Any:
    """A plain copy of ``frame`` as it reads: NULLs empty, whole numbers without ``.0``."""
    import pandas as pd

    copy = pd.DataFrame(frame).copy()
    for name in copy.columns:
        column = copy[name]
        if isinstance(column, pd.DataFrame) or not column.isna().any():
            continue  # a duplicated column name, or nothing to change
        if _whole_numbers_with_nulls(column):
            copy[name] = [("" if pd.isna(v) else int(v)) for v in column]
        else:
            copy[name] = column.astype(object).where(column.notna(), "")
    return copy


@functools.cache
def _ledger_frame_class() -> type:
    import pandas as pd

    from .._core.process.runs_frame import ShownFrame

    class LedgerFrame(ShownFrame):
        """A ``%%ledger`` result: a DataFrame that displays NULLs empty (one of
        ``kx.sql()``'s tables, so the two compare equal)."""

        @property
        def _constructor(self) -> Any:  # frames computed from it are plain DataFrames
            return pd.DataFrame

        def __repr__(self) -> str:  # cells through the display door (kernelext._shown)
            return repr(shown_frame(shown(self)))

        def _repr_html_(self) -> str | None:
            return shown_frame(shown(self))._repr_html_()  # type: ignore[no-any-return]

        def __reduce_ex__(self, protocol: Any) -> Any:  # pickle, df.to_pickle(...)
            return (_ledger_frame, (pd.DataFrame(self),))

    LedgerFrame.__module__ = "kernelext"
    return LedgerFrame


def _ledger_frame(frame: Any) -> Any:
    """A pickled ``%%ledger`` result, back as one."""
    return _ledger_frame_class()(frame)


def for_display(result: Any) -> Any:
    """``result`` of ``kx.sql`` as the magic returns it (a pyarrow Table stays one)."""
    try:
        import pandas as pd
    except ImportError:
        return result
    if not isinstance(result, pd.DataFrame):
        return result
    return _ledger_frame_class()(result)
