"""kernelext's Jupyter Server extension: a panel's Stop reaches the store while the kernel is busy.

A click on a widget button is a message on the kernel's shell channel, handled after every
cell queued before it. The panel's Stop and Force stop are therefore sent to the notebook
server instead (``POST {base_url}kernelext/api/stop`` or ``.../force``), which records the
request in the store through the same door as ``kernelext stop``
(``kernelext._core.lifecycle.from_elsewhere.act``) on a thread of its own, never on the server's
event loop. Requests are authenticated and XSRF-checked like the server's own API, and
authorized as a write on ``kernels``: whoever may run code in a kernel may stop a run.

The extension is enabled when kernelext is installed (``jupyter-config/`` holds the
``jupyter_server_config.d`` file the wheel ships). It imports Jupyter Server, so nothing
outside this package imports it.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "kernelext._server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .handlers import install

    install(serverapp)
