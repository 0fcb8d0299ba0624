"""Errors raised by :mod:`verify`, part of pipesim's one hierarchy.

Each is a :class:`~pipesim.errors.PipesimError`, so ``pipesim verify`` turns it
into ``pipesim: error: ...`` without a traceback; ``exit_status`` is the exit
status a CI job sees (``pipesim verify --help`` lists them):

- 2 :class:`VerifyError`: bad usage or input (model, devices, batch size, split);
- 3 :class:`ExactnessError`: the environment cannot give an exact result;
- 4 :class:`RunFailedError`: a rank failed, died or hung during the run.

A run that completes but is not bit-identical is not an error: exit status 1.
"""

from __future__ import annotations

from pipesim.errors import PipesimError

__all__ = ["ExactnessError", "RunFailedError", "VerifyError"]


class VerifyError(PipesimError, ValueError):
    """Bad input to a verification: model, devices, batch size, stage split."""

    exit_status = 2


class ExactnessError(VerifyError):
    """A setting makes a bit-identical result impossible; the message names each one.

    ``settings`` holds one line per offending setting. Also raised for a GPU
    that was asked for and is not there.
    """

    exit_status = 3

    def __init__(self, message: str, *, settings: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.settings = settings


class RunFailedError(VerifyError):
    """A rank failed, died or missed a deadline; the message names the rank, the action it
    was running or waiting for, and the peer."""

    exit_status = 4
