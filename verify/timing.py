"""When each unit of work ran, measured without serialising a GPU's stream.

On the CPU a unit runs when the host calls it, so ``time.perf_counter_ns`` around it is
its span. On a CUDA device the host only queues the work: a host clock would need a
``torch.cuda.synchronize`` before and after every unit, which drains the stream and
keeps the host from queueing ahead (the step measured is then not the step that runs
unmeasured). Instead a CUDA event is recorded before and after each unit on the
device's current stream (``torch.cuda.Event(enable_timing=True)``), and all of them are
read once, after one synchronize at the end of the step: PyTorch's recipe for timing
asynchronous work (CUDA semantics notes, "Asynchronous execution"). Event times are
placed on the host's timeline through an origin event recorded, after a synchronize,
at the host time the clock started.

:class:`UnitClock` hides the difference; its two device hooks (make and record an
event, synchronize) can be replaced, so the CUDA path runs in tests without a GPU.

>>> import torch
>>> clock = UnitClock([torch.device("cpu")])
>>> spans = []
>>> start = clock.mark(torch.device("cpu"))
>>> end = clock.mark(torch.device("cpu"))
>>> clock.span(torch.device("cpu"), start, end, lambda s, e: spans.append(e >= s >= 0))
>>> clock.finish()
>>> spans
[True]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

__all__ = ["DeviceEvent", "UnitClock", "cuda_event", "cuda_synchronize", "median_step_index"]


class DeviceEvent(Protocol):
    """What :class:`UnitClock` needs of an event: ``torch.cuda.Event``'s ``elapsed_time``
    (milliseconds from this event to ``end``, both recorded and complete)."""

    def elapsed_time(self, end_event: Any, /) -> float: ...


def cuda_event(device: torch.device) -> DeviceEvent:
    """A timing event recorded now on ``device``'s current stream."""
    with torch.cuda.device(device.index):
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
    return event


def cuda_synchronize(device: torch.device) -> None:
    """Wait until everything queued on ``device`` has run."""
    torch.cuda.synchronize(device)


class UnitClock:
    """Spans of units of work in nanoseconds since the clock started (``origin_ns`` on the
    host's ``time.perf_counter_ns``, shared by the processes of one machine).

    ``mark(device)`` before and after a unit, ``span(device, start, end, done)`` to have
    ``done(start_ns, end_ns)`` called: at once on the CPU, at :meth:`finish` for a CUDA
    device (events are read only then). The clock synchronizes each CUDA device when it
    starts and when it finishes, never in between. ``record`` and ``synchronize`` are
    the device hooks (default: :func:`cuda_event`, :func:`cuda_synchronize`).
    """

    def __init__(
        self,
        devices: Sequence[torch.device],
        *,
        record: Callable[[torch.device], DeviceEvent] = cuda_event,
        synchronize: Callable[[torch.device], None] = cuda_synchronize,
    ) -> None:
        self.record, self.synchronize = record, synchronize
        self.cuda = sorted({d for d in devices if d.type == "cuda"}, key=lambda d: d.index or 0)
        for device in self.cuda:
            synchronize(device)
        self.origin_ns = time.perf_counter_ns()
        # Recorded on idle devices right after the host time: event time 0 is origin_ns.
        self.origin = {device: record(device) for device in self.cuda}
        self.pending: list[tuple[DeviceEvent, Any, Any, Callable[[int, int], None]]] = []

    def mark(self, device: torch.device) -> Any:
        """An event on a CUDA device, else the host's nanoseconds since the start."""
        if device.type == "cuda":
            return self.record(device)
        return time.perf_counter_ns() - self.origin_ns

    def span(
        self, device: torch.device, start: Any, end: Any, done: Callable[[int, int], None]
    ) -> None:
        """Report ``(start_ns, end_ns)`` to ``done`` now (CPU) or at :meth:`finish` (CUDA)."""
        if device.type == "cuda":
            self.pending.append((self.origin[device], start, end, done))
        else:
            done(start, end)

    def finish(self) -> None:
        """Synchronize each CUDA device once and report the spans waiting for it."""
        for device in self.cuda:
            self.synchronize(device)
        for origin, start, end, done in self.pending:
            done(round(origin.elapsed_time(start) * 1e6), round(origin.elapsed_time(end) * 1e6))
        self.pending = []


def median_step_index(makespans: Sequence[int], /) -> int:
    """Which of several measured steps to report: the one of median makespan, the lower
    middle of an even count, the earlier of equal ones. A single step is noisy on a shared
    machine (one late message or one descheduled rank moves it); the median lies where
    most steps do, and it is a step that really ran, so its trace and the costs fitted
    from it stay those of one consistent step.

    >>> median_step_index([30, 10, 20]), median_step_index([5, 9, 7, 6]), median_step_index([4])
    (2, 3, 0)
    """
    order = sorted(range(len(makespans)), key=lambda k: (makespans[k], k))
    return order[(len(order) - 1) // 2]
