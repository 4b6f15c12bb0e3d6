"""``python -m kernelext``: the command line (see ``kernelext --help``)."""

from __future__ import annotations

import sys

from ._cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
