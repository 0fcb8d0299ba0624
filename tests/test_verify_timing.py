"""verify.timing: CUDA-event timing, run on the CPU through fake device hooks.

The fake device has its own clock (milliseconds, as CUDA events report) that the test
advances as "the GPU runs"; the oracle is the hand-computed span of each unit, and the
synchronize calls the clock made (one per device when it starts and when it finishes,
none around units: timing must not serialise the stream).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from verify.timing import UnitClock  # noqa: E402


class FakeEvent:
    def __init__(self, at_ms: float) -> None:
        self.at_ms = at_ms

    def elapsed_time(self, end_event: FakeEvent, /) -> float:
        return end_event.at_ms - self.at_ms


class FakeDevice:
    """A GPU whose stream clock the test moves; records the hooks' calls."""

    def __init__(self, start_ms: float) -> None:
        self.now_ms = start_ms
        self.calls: list[str] = []

    def record(self, device: torch.device) -> FakeEvent:
        self.calls.append(f"record {device}")
        return FakeEvent(self.now_ms)

    def synchronize(self, device: torch.device) -> None:
        self.calls.append(f"sync {device}")


def test_cuda_units_are_timed_by_events_read_once_at_the_end() -> None:
    gpu = torch.device("cuda", 1)
    fake = FakeDevice(start_ms=1000.0)  # the device clock's own zero is arbitrary
    clock = UnitClock([gpu, gpu], record=fake.record, synchronize=fake.synchronize)
    assert fake.calls == ["sync cuda:1", "record cuda:1"]  # once per device, the origin event
    spans: list[tuple[str, int, int]] = []
    for name, gap_ms, length_ms in (("1F0", 0.5, 2.0), ("1B0", 1.25, 3.0)):
        fake.now_ms += gap_ms
        start = clock.mark(gpu)
        fake.now_ms += length_ms
        end = clock.mark(gpu)
        clock.span(gpu, start, end, lambda s, e, name=name: spans.append((name, s, e)))
    assert spans == []  # nothing read before the end of the step
    assert "sync" not in " ".join(fake.calls[2:])  # no synchronize around the units
    clock.finish()
    assert fake.calls[-1] == "sync cuda:1" and fake.calls.count("sync cuda:1") == 2
    # 1F0 from 0.5 to 2.5 ms after the origin, 1B0 from 3.75 to 6.75 ms, in nanoseconds.
    assert spans == [("1F0", 500_000, 2_500_000), ("1B0", 3_750_000, 6_750_000)]


def test_the_cpu_is_timed_by_the_host_clock_at_once_and_never_synchronized() -> None:
    fake = FakeDevice(start_ms=0.0)
    cpu = torch.device("cpu")
    clock = UnitClock([cpu], record=fake.record, synchronize=fake.synchronize)
    spans: list[tuple[int, int]] = []
    start = clock.mark(cpu)
    sum(range(10_000))
    end = clock.mark(cpu)
    clock.span(cpu, start, end, lambda s, e: spans.append((s, e)))
    assert len(spans) == 1 and 0 <= spans[0][0] <= spans[0][1]
    clock.finish()
    assert fake.calls == [] and len(spans) == 1


def test_a_mixed_run_synchronizes_each_gpu_and_keeps_their_origins_apart() -> None:
    fake = FakeDevice(start_ms=7.0)
    a, b = torch.device("cuda", 0), torch.device("cuda", 1)
    clock = UnitClock([b, torch.device("cpu"), a], record=fake.record, synchronize=fake.synchronize)
    assert fake.calls == ["sync cuda:0", "sync cuda:1", "record cuda:0", "record cuda:1"]
    fake.now_ms += 1.0
    start = clock.mark(b)
    fake.now_ms += 0.25
    end = clock.mark(b)
    spans: list[tuple[int, int]] = []
    clock.span(b, start, end, lambda s, e: spans.append((s, e)))
    clock.finish()
    assert spans == [(1_000_000, 1_250_000)]
