"""Errors raised by :mod:`verify`, part of pipesim's one hierarchy.

Each is a :class:`~pipesim.errors.PipesimError`, so ``pipesim verify`` turns it
into ``pipesim: error: ...`` and a non-zero exit status without a traceback.
"""

from __future__ import annotations

from pipesim.errors import PipesimError

__all__ = ["ExactnessError", "VerifyError"]


class VerifyError(PipesimError, ValueError):
    """Bad input to a verification: model, devices, batch size, stage split."""


class ExactnessError(VerifyError):
    """A setting makes a bit-identical result impossible; the message names each one.

    ``settings`` holds one line per offending setting.
    """

    def __init__(self, message: str, *, settings: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.settings = settings
