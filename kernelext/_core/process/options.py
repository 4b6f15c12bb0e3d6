"""Every option of kernelext, declared once: name, kind, default, check, meaning.

:data:`OPTIONS` is the one list. Everything else is derived from it:

- ``kx.configure(**options)`` (``api.py``): the same names, each value checked by the
  option's ``check`` before any is applied;
- the values a runtime keeps (:class:`OptionValues`, which ``Settings`` extends): each
  starts at its option's ``default``;
- ``%config Kernelext.<option>`` (``kernelext/_ipython/magics.py``): one trait per option,
  with ``help`` as its help text, that takes any value and hands it to ``kx.configure``
  (the option's ``check`` is the only check) and reads the runtime's current value;
- the command-line flag of an option that has ``cli`` (``kernelext/_cli/main.py``);
- the options table of the documentation (:func:`options_table`, in ``docs/notebooks.md``;
  ``tests/contracts/test_options.py`` fails when that table differs).

An option whose value is ``None`` in a call is left as it is. Adding an option is one
entry here (and, for one the runtime keeps, reading it where it acts).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload

from ..._expiry_policy import DEFAULT_EXPIRY, ExpiryPolicy
from ..._formatting import duration_text
from ..._shown import shows
from ..._validate import check_duration, check_flag, check_store_location

if TYPE_CHECKING:
    from .runtime import Settings

__all__ = ["OPTIONS", "Option", "OptionValues", "option_named", "options_table"]

T = TypeVar("T")
Kind = Literal["location", "durations", "seconds", "flag"]
"""What an option takes: a store location (text), per-reason durations (a dict), a number
of seconds, or True/False."""


class Option(Generic[T]):
    """One option. Declared in :class:`OptionValues` it is also the attribute that holds
    the runtime's value (read ``runtime().settings.<name>``); declared on its own it says
    with ``apply`` and ``read`` where the runtime keeps it.

    - ``check(where, value)`` refuses a bad value (``TypeError`` for a wrong type,
      ``ValueError`` for a bad value) and returns the value as kept; ``where`` is how the
      user set it (``"kx.configure(store=...)"``, ``"--store"``).
    - ``meaning``: one line (the options table, the command-line help); ``details`` adds to
      it in the ``%config`` help.
    - ``default_text``: the default as the options table shows it (else derived from
      ``default``).
    - ``notebook``: read only in a notebook (the extension puts it back when unloaded).
    - ``cli``: the command-line flag that sets it for one command.
    - ``apply`` / ``read``: how ``kx.configure`` sets it and how its value is read, for
      one not kept as an attribute of the same name (default: that attribute).
    - ``not_while_running``: refused while runs execute in this process (the refusal's
      first words).
    """

    def __init__(
        self,
        default: T,
        check: Callable[[str, object], T],
        *,
        kind: Kind,
        meaning: str,
        details: str = "",
        name: str = "",
        default_text: str = "",
        notebook: bool = False,
        cli: str | None = None,
        apply: Callable[[Settings, T], None] | None = None,
        read: Callable[[Settings], object] | None = None,
        not_while_running: str | None = None,
    ) -> None:
        self.name = name
        self.default = default
        self.check = check
        self.kind = kind
        self.meaning = meaning
        self.details = details
        self._default_text = default_text
        self.notebook = notebook
        self.cli = cli
        self._apply = apply
        self._read = read
        self.not_while_running = not_while_running

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Option[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object, owner: type | None = None) -> Option[T] | T:
        if obj is None:
            return self
        return cast(T, obj.__dict__.get(self.name, self.default))

    def __set__(self, obj: object, value: T) -> None:
        obj.__dict__[self.name] = value

    def apply(self, settings: Settings, value: T) -> None:
        """Set this option of ``settings`` to ``value`` (already checked)."""
        if self._apply is not None:
            self._apply(settings, value)
        else:
            setattr(settings, self.name, value)

    def current(self, settings: Settings) -> object:
        """This option's value in ``settings`` now (``expiry``: every reason's duration)."""
        return self._read(settings) if self._read is not None else getattr(settings, self.name)

    @property
    def default_text(self) -> str:
        """The default as the options table shows it (Markdown)."""
        if self._default_text:
            return self._default_text
        value: object = self.default
        if value is None:
            return "none"
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, float) and self.kind == "seconds":
            days = value / 86400
            return f"{days:g} days" if days >= 1 and days.is_integer() else f"{value:g} s"
        return repr(value)

    @property
    def help(self) -> str:
        """The ``%config`` help text: meaning and details (and the default of a location,
        which the trait's own default, None, does not tell)."""
        parts = [f"{self.meaning[0].upper()}{self.meaning[1:]}.", self.details]
        if self.kind == "location":
            parts.append(f"Default: {self.default_text}.")
        return " ".join(part for part in parts if part).replace("`", "")

    @shows
    def __repr__(self) -> str:
        return f"<Option {self.name} ({self.kind}, default {self.default_text})>"


# -- the checks ---------------------------------------------------------------------------
def seconds(*, zero: bool = False) -> Callable[[str, object], float]:
    """A positive number of seconds (or a timedelta); ``zero``: 0 is allowed (it means off)."""

    def check(where: str, value: object) -> float:
        checked = check_duration(where, value, allow_zero=zero)
        assert checked is not None  # allow_none is off
        return checked

    return check


def optional_seconds(where: str, value: object) -> float | None:
    """A positive number of seconds (``None`` means no bound)."""
    return check_duration(where, value, allow_none=True)


def store_location(where: str, value: object) -> str | None:
    """A DuckDB file path or a ``postgresql://`` URL (``None``: the default location)."""
    return None if value is None else os.fspath(check_store_location(where, value))


def durations(where: str, value: object) -> dict[str, Any]:
    """Reason -> seconds (or timedelta); every duration is checked (``ValueError``)."""
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{where} takes a dict of reason -> seconds (or timedelta), "
            f"e.g. {{'approval': 3600}}, not {value!r}."
        )
    ExpiryPolicy(value)  # checks every duration first (ValueError)
    return dict(value)


# -- the options ---------------------------------------------------------------------------
class OptionValues:
    """The options a runtime keeps as plain values (``Settings`` extends this class)."""

    retention_seconds = Option[float](
        30 * 86400.0,
        seconds(zero=True),  # zero: no snapshot is kept after expiry
        kind="seconds",
        meaning="how long an expired run's snapshot is kept",
        details="In seconds (or a timedelta); 0 keeps none.",
    )
    check_timeout = Option[float](
        10.0,
        seconds(),  # zero would fail every check
        kind="seconds",
        meaning="time bound of each fact re-check",
        details="In seconds: a re-check on resume that takes longer counts as a contradiction.",
    )
    max_step_seconds = Option[float | None](
        None,
        optional_seconds,
        kind="seconds",
        meaning="default step time bound for `%%agent` cells",
        details="In seconds; a cell's --max-step-seconds overrides it.",
        notebook=True,
    )
    soft_interrupt = Option[bool](
        True,
        check_flag,
        kind="flag",
        meaning="the interrupt button stops a live agent softly",
        details="While an agent runs in the background, the interrupt button asks it to stop "
        "at its next safe point (a second press within interrupt_window forces it).",
        notebook=True,
    )
    interrupt_window = Option[float](
        2.0,
        seconds(zero=True),  # zero turns the forcing second press off
        kind="seconds",
        meaning="a second press within it forces the stop",
        details="In seconds; 0 turns the forcing second press off.",
        notebook=True,
    )
    force_call_grace = Option[float](
        10.0,
        seconds(zero=True),  # zero: a Force stop cuts a call in flight at once
        kind="seconds",
        meaning="how long Force stop waits for a recorded call in flight to return",
        details="In seconds. A call that returns within it keeps its real outcome (applied "
        "with its result); after it, or at a second Force stop, the call is cut and its "
        "outcome becomes unknown. 0 cuts at once.",
    )
    allow_files = Option[bool](
        False,
        check_flag,
        kind="flag",
        meaning="`%%ledger` queries may read files outside the store",
        details="read_csv, glob, 'data.parquet'; like kx.sql(..., allow_files=True).",
        notebook=True,
    )


def _switch_store(settings: Settings, location: str | None) -> None:
    settings.use_store(location)


def _update_expiry(settings: Settings, value: dict[str, Any]) -> None:
    settings.expiry.update(value)


STORE = Option[str | None](
    None,
    store_location,
    name="store",
    kind="location",
    meaning="a DuckDB path or a `postgresql://` URL",
    details="Where runs are recorded; refused while runs execute in this process.",
    default_text="`KERNELEXT_STORE`, else `.kernelext/store.duckdb`",
    cli="--store",
    apply=_switch_store,
    read=lambda settings: settings.store_location,
    not_while_running="Cannot switch the kernelext store",
)
EXPIRY = Option[dict[str, Any]](
    {},
    durations,
    name="expiry",
    kind="durations",
    meaning="per-reason suspension durations (seconds or timedelta)",
    details="How long a suspended run lives, per reason, in seconds: e.g. "
    "{'user_stop': 7 * 86400, 'rate_limit': 3600}; reasons left out keep theirs. Reasons: "
    + ", ".join(DEFAULT_EXPIRY)
    + " (decision: a run waiting in needs_decision; other: any reason not listed).",
    default_text="per reason: "
    + ", ".join(f"`{reason}` {duration_text(span)}" for reason, span in DEFAULT_EXPIRY.items()),
    apply=_update_expiry,
    read=lambda settings: dict(settings.expiry.durations),
)

OPTIONS: tuple[Option[Any], ...] = (
    STORE,
    EXPIRY,
    *(value for value in vars(OptionValues).values() if isinstance(value, Option)),
)
"""Every option, in the order the options table lists them."""


def option_named(name: str) -> Option[Any] | None:
    """The option called ``name``, or ``None``."""
    return next((option for option in OPTIONS if option.name == name), None)


def options_table() -> str:
    """The options table of the documentation (Markdown), as the declaration says it."""
    lines = ["| option | default | meaning |", "|---|---|---|"]
    lines += [
        f"| `Kernelext.{option.name}` | {option.default_text} | {option.meaning} |"
        for option in OPTIONS
    ]
    return "\n".join(lines)
