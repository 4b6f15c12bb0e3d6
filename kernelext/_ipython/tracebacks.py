"""What a notebook shows for a kernelext error: its message and the user's own frames.

A :class:`~kernelext.errors.KernelextError` raised in a cell is shown by IPython's own
traceback printer, with every frame whose file lies inside the kernelext package (and
its widgets) left out: what stays is the cell and the user's functions, then the
message, which says what to do. Other exceptions, interrupts and stops are untouched.

Installed by ``%load_ext kernelext`` and by ``import kernelext`` inside IPython (an
error from ``kx.resume`` should read well whether or not the extension is loaded), once,
and only when the shell has no custom exception handler of its own.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import types
from typing import Any

from ..errors import KernelextError

__all__ = ["install", "installed", "is_internal", "without_internal_frames"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def _internal_dirs() -> tuple[str, ...]:
    dirs = [_PACKAGE_DIR]
    spec = importlib.util.find_spec("kernelext.widgets")  # its files may lie elsewhere
    if spec is not None and spec.origin:
        dirs.append(os.path.dirname(os.path.abspath(spec.origin)))
    return tuple(d + os.sep for d in dirs)


def is_internal(filename: str) -> bool:
    """Whether a frame's file lies inside kernelext (or its widgets)."""
    path = os.path.abspath(filename)
    return path.startswith(_internal_dirs())


def without_internal_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback ``tb`` with kernelext's own frames left out (the others in order)."""
    kept: list[types.TracebackType] = []
    while tb is not None:
        if not is_internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    rebuilt: types.TracebackType | None = None
    for entry in reversed(kept):
        rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


def _strip_chain(value: BaseException) -> list[tuple[BaseException, types.TracebackType | None]]:
    """Leave kernelext's frames out of the kernelext errors chained to ``value`` too;
    answers each changed error with its full traceback (put back after the display)."""
    changed: list[tuple[BaseException, types.TracebackType | None]] = []
    seen: set[int] = {id(value)}
    link = value.__cause__ or value.__context__
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, KernelextError):
            changed.append((link, link.__traceback__))
            link.__traceback__ = without_internal_frames(link.__traceback__)
        link = link.__cause__ or link.__context__
    return changed


def show_kernelext_error(
    shell: Any, etype: type[BaseException], value: BaseException, tb: Any, tb_offset: Any = None
) -> list[str]:
    """IPython's custom exception handler for :class:`KernelextError`."""
    if hasattr(value, "_render_traceback_"):  # the error draws itself (one line)
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)  # IPython calls it
        return []  # the shell ignores what a handler returns: it must show the error itself
    first = tb  # IPython's own frame: its printer leaves the first one out
    rest = without_internal_frames(tb.tb_next if tb is not None else None)
    if first is not None:
        rest = types.TracebackType(rest, first.tb_frame, first.tb_lasti, first.tb_lineno)
    changed = [(value, value.__traceback__), *_strip_chain(value)]
    value.__traceback__ = rest
    call_pdb = shell.call_pdb  # %pdb on: the debugger opens on the full traceback, below
    shell.call_pdb = False
    try:
        shell.showtraceback((etype, value, rest), tb_offset=tb_offset)
    finally:
        shell.call_pdb = call_pdb
        for error, full in changed:  # only the display leaves frames out
            error.__traceback__ = full
        _remember(etype, value, tb)
    if call_pdb:
        shell.debugger(force=True)
    return []


def _remember(etype: type[BaseException], value: BaseException, tb: Any) -> None:
    """What %debug and %tb read: the exception with every frame (where it was raised)."""
    import sys

    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = value


def installed(shell: Any) -> bool:
    """Whether ``shell`` shows kernelext errors without kernelext's frames."""
    return KernelextError in getattr(shell, "custom_exceptions", ())


def install(shell: Any) -> bool:
    """Install the handler on ``shell`` unless it has a custom handler already."""
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    if installed(shell):
        return True
    if getattr(shell, "custom_exceptions", ()):  # the user's own handler stays
        return False
    shell.set_custom_exc((KernelextError,), show_kernelext_error)
    return True


def install_in_running_shell() -> bool:
    """On ``import kernelext``: install into the running IPython shell, if there is one."""
    import sys

    if "IPython" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
        _register_placeholders(shell)
        return install(shell)
    except Exception:  # never let importing kernelext fail over a traceback printer
        return False


MAGICS = ("agent", "ledger")  # every magic of kernelext/_ipython/magics.py


def _register_placeholders(shell: Any) -> None:
    """``%%ledger`` before ``%load_ext kernelext`` says to load it (the extension's own
    magics replace these when it loads)."""
    if shell is None or not hasattr(shell, "register_magic_function"):
        return
    from IPython.core.error import UsageError

    manager = shell.magics_manager
    for name in MAGICS:
        if name in manager.magics["line"] or name in manager.magics["cell"]:
            continue

        def placeholder(line: str = "", cell: str | None = None, *, _name: str = name) -> None:
            raise UsageError(
                f"%{_name} is a kernelext magic: run %load_ext kernelext first, "
                "then this cell again."
            )

        placeholder.__name__ = name
        shell.register_magic_function(placeholder, magic_kind="line_cell", magic_name=name)
