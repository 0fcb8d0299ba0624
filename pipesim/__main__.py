"""``python -m pipesim``: the same command line as the ``pipesim`` script."""

from __future__ import annotations

import sys

from pipesim.cli import main

if __name__ == "__main__":
    sys.exit(main())
