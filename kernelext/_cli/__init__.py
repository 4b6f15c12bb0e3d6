"""The ``kernelext`` command line (also ``python -m kernelext``); see ``kernelext --help``.

``main`` parses and dispatches (``main.py``); each group of commands has its module:
``runs`` (runs, show, stop, sweep, sql), ``plan``, ``reconcile``, ``notebook`` (run); ``common``
holds exit codes, output, and opening the store.
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]
