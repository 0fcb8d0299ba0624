"""The schedule registry: name -> generator, with each schedule's rules and source.

A generator is a function ``(*, n_ranks, n_microbatches, virtual, forward_only,
**options) -> Schedule``. Register a new family by adding a :class:`ScheduleSpec`
to ``_SPECS`` in :mod:`pipesim.schedules` (one module per family).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipesim import limits
from pipesim.errors import ScheduleError, UnknownNameError, brief
from pipesim.limits import MAX_STAGES, as_int, check_actions, check_range
from pipesim.nogc import paused_gc
from pipesim.schedule import Schedule
from pipesim.suggest import did_you_mean

__all__ = ["ScheduleSpec", "generate", "get_spec", "least_actions", "register", "schedule_names"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A registered schedule family."""

    name: str
    """The registry key, as typed on the command line."""
    generator: Callable[..., Schedule]
    """Builds the schedule; keyword-only arguments."""
    summary: str
    """One line: what the schedule does."""
    rules: str
    """The parameter rules the generator enforces."""
    source: str
    """Where the schedule comes from (paper, code)."""
    default_virtual: int = 1
    """Stages per rank when ``virtual`` is not given."""
    virtual_values: tuple[int, ...] | None = None
    """The only stages-per-rank values the schedule accepts; None for any (interleaved)."""
    forward_only: bool = False
    """Whether a forward-only (inference) variant exists."""
    options: tuple[str, ...] = ()
    """Extra keyword options the generator takes (e.g. ``group_size``)."""
    n_copies: int = 1
    """Model copies the schedule runs (DualPipe: 2), each on its share of the micro-batches."""


_REGISTRY: dict[str, ScheduleSpec] = {}


def register(spec: ScheduleSpec, /) -> ScheduleSpec:
    """Add ``spec`` to the registry; a name can be registered once."""
    if spec.name in _REGISTRY:
        raise ValueError(f"schedule {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def schedule_names() -> tuple[str, ...]:
    """Registered names, in registration order."""
    return tuple(_REGISTRY)


def get_spec(name: str, /) -> ScheduleSpec:
    """The spec of ``name``; UnknownNameError listing the valid names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown schedule {name!r}{did_you_mean(name, _REGISTRY)}; "
            f"valid schedules are: {', '.join(_REGISTRY)} "
            "(or give a .json / .csv schedule file)"
        ) from None


def generate(
    name: str,
    /,
    *,
    n_ranks: int,
    n_microbatches: int,
    virtual: int | None = None,
    forward_only: bool = False,
    options: Mapping[str, Any] | None = None,
) -> Schedule:
    """Build the registered schedule ``name``.

    ``n_ranks`` is the pipeline depth p (one rank per device); ``virtual`` the
    stages each rank holds (the model is cut into ``n_ranks * virtual``
    stages); ``options`` the family's extra options.

    >>> generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True).n_stages
    2
    """
    spec = get_spec(name)
    n_ranks, n_microbatches, virtual = _sizes(spec, n_ranks, n_microbatches, virtual, forward_only)
    options = dict(options or {})
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        allowed = ", ".join(spec.options) or "none"
        raise ScheduleError(f"schedule {name!r} takes no option {unknown}; its options: {allowed}")
    if forward_only and not spec.forward_only:
        with_variant = [s.name for s in _REGISTRY.values() if s.forward_only]
        raise ScheduleError(
            f"schedule {name!r} has no forward-only variant; forward-only schedules are: "
            f"{', '.join(with_variant)}"
        )
    with paused_gc():  # a generator allocates a few objects per action, no cycles
        return spec.generator(
            n_ranks=n_ranks,
            n_microbatches=n_microbatches,
            virtual=virtual,
            forward_only=forward_only,
            **options,
        )


def _sizes(
    spec: ScheduleSpec,
    n_ranks: object,
    n_microbatches: object,
    virtual: object,
    forward_only: bool,
) -> tuple[int, int, int]:
    """The sizes as ints (numpy integers are fine), refused up front when a schedule of
    that size would pass a limit of :mod:`pipesim.limits`, before anything is built."""
    sizes = []
    for name, value, limit in (
        ("n_ranks", n_ranks, "MAX_RANKS"),
        ("n_microbatches", n_microbatches, "MAX_MICROBATCHES"),
        ("virtual", spec.default_virtual if virtual is None else virtual, "MAX_STAGES"),
    ):
        size = as_int(value)
        if size is None or size < 1:
            raise ScheduleError(f"{name} must be a whole number >= 1, got {brief(value)}")
        sizes.append(check_range(size, name=name, maximum=getattr(limits, limit), limit=limit))
    p, m, v = sizes
    check_range(p * v, name="stages (n_ranks x virtual)", maximum=MAX_STAGES, limit="MAX_STAGES")
    check_actions(
        least_actions(
            n_ranks=p,
            virtual=v,
            n_microbatches=m,
            n_copies=spec.n_copies,
            forward_only=forward_only,
        ),
        what=f"{spec.name} with {p} ranks, {v} stages per rank and {m} micro-batches",
    )
    return p, m, v


def least_actions(
    *,
    n_ranks: int,
    virtual: int,
    n_microbatches: int,
    n_copies: int = 1,
    forward_only: bool = False,
) -> int:
    """The fewest simple actions a schedule of this size has (``n_copies``: the model
    copies it runs, :attr:`ScheduleSpec.n_copies`).

    Every stage runs F and, when training, B or I + W of each micro-batch of its model
    copy, so p v (m / copies) x 2 is a lower bound (exact for F + B schedules).

    >>> least_actions(n_ranks=4, virtual=1, n_microbatches=8)
    64
    """
    per_stage = n_microbatches // n_copies * (1 if forward_only else 2)
    return n_ranks * virtual * per_stage
