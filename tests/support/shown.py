"""A store shown by a panel, as a kernel of the notebook server shows it.

The notebook server's route opens only the stores that a kernel of its user drew buttons
for (``kernelext._core.process.shown_stores``). A kernel the server starts inherits the server's
``JUPYTER_RUNTIME_DIR``; :func:`shown_by_a_panel` draws the same buttons in this process
with that folder, so that what the panel notes is what the test's clicks name.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["runtime_dir_of", "shown_by_a_panel"]

# The environment is the process's: clicks sent from several threads at once each note their
# store one after another (else one thread's restore takes the folder from under another's).
_ENVIRONMENT = threading.RLock()


@contextlib.contextmanager
def runtime_dir_of(folder: Path) -> Iterator[None]:
    """Jupyter's runtime folder is ``folder`` in this process meanwhile (as in a kernel)."""
    with _ENVIRONMENT:
        before = os.environ.get("JUPYTER_RUNTIME_DIR")
        os.environ["JUPYTER_RUNTIME_DIR"] = str(folder)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("JUPYTER_RUNTIME_DIR", None)
            else:
                os.environ["JUPYTER_RUNTIME_DIR"] = before


def shown_by_a_panel(folder: Path, address: str) -> None:
    """Buttons for the store at ``address`` are drawn, by a kernel whose Jupyter runtime
    folder is ``folder`` (a panel's Stop and Force stop, as ``kx.panel`` draws them)."""
    from kernelext.widgets._stop_buttons import StopButtons

    with runtime_dir_of(folder):
        StopButtons(lambda *_args: None, run_id="shown", store=address).close()
