"""``python -m verify ...`` is ``pipesim verify ...``; under ``torchrun -m verify`` each
process runs one rank (see :mod:`verify.torchrun`)."""

from __future__ import annotations

import sys

from pipesim.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main(["verify", *sys.argv[1:]]))
