"""The cost model: how long each action takes, what it holds in memory, what links cost.

Costs are per stage (a stage of an interleaved rank is one chunk) and per
micro-batch. :meth:`CostModel.uniform` is the shorthand for identical stages;
``stages`` with one entry per stage describes uneven ones. A single entry is
broadcast to every stage by :meth:`CostModel.for_stages`.

Memory model (per rank, activations only): see :mod:`pipesim.step.memory`, where it is
written once.

Link model: a message of ``n`` bytes holds its link (one per ordered pair of
ranks; ``max_concurrent`` messages at once) for ``n / bandwidth`` and arrives
``latency`` after it leaves the link. With ``blocking_sends`` the sending rank waits
for its send to arrive before it runs its next action (gloo's blocking ``send``).

Overheads that block a rank (measured on gloo and torch: posting a send, taking
a message that has arrived, and the executor's own code between two actions
cost the rank time that a link latency cannot express): each cross-rank
message costs its sender ``Link.send_overhead`` after the work that produced
it and its receiver ``Link.receive_overhead`` before the work that needs it,
and every unit of work costs its rank ``CostModel.dispatch_overhead`` more.
:func:`pipesim.step.cost_tables.cost_tables` adds them to the durations (the rule is
written there once), so a unit of work holds its rank for
``dispatch + receives + compute + sends``; all are 0 by default.

>>> costs = CostModel.uniform(forward=1, backward=2, activation_bytes=100)
>>> costs.for_stages(4).stage(3).backward
2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from pipesim.actions import Action, Op, Overlap, Work
from pipesim.errors import CostError, ParseError, UnknownNameError, brief
from pipesim.exact import Time, to_count, to_time
from pipesim.files import read_json
from pipesim.limits import MAX_DENOMINATOR_DIGITS, MAX_STAGES, check_range
from pipesim.units import check_time_unit, parse_bytes

__all__ = [
    "CostModel",
    "Link",
    "LinkPair",
    "Links",
    "StageCost",
    "costs_from_dict",
    "costs_to_dict",
    "load_costs",
    "require_eager",
]


#: The message timing rules ``CostModel.send_mode`` names (:mod:`pipesim.engine`).
SEND_MODES = ("eager", "rendezvous")

#: ``weight_grad_bytes / activation_bytes`` when ``weight_grad_bytes`` is not given:
#: ``M_W / M_B`` of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 2,
#: Table 1 ("activations memory required per transformer layer": B needs
#: ``M_B = sb(34h + 5as)`` bytes, W ``M_W = 32sbh``), with the attention-score term
#: ``5as^2b`` not stored (flash attention, or selective recomputation): 32/34. With
#: the scores stored the share is ``32h / (34h + 5as)``, smaller; give
#: ``weight_grad_bytes`` then (the planner computes it per layer, pipesim.plan.layers).
W_SHARE = Fraction(16, 17)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCost:
    """What one stage costs per micro-batch."""

    forward: Time = 1
    """Duration of F."""
    backward: Time = 2
    """Duration of a full backward B."""
    input_grad: Time = 1
    """Duration of I (input-gradient half of a split backward)."""
    weight_grad: Time = 1
    """Duration of W (weight-gradient half of a split backward)."""
    overlap: Time | None = None
    """Duration of an overlapped F&B pair on this stage's rank; None: sum of the parts."""
    activation_bytes: int = 0
    """Activation bytes one micro-batch holds on this stage from F until freed."""
    weight_grad_bytes: int = None  # type: ignore[assignment]  # resolved in __post_init__
    """Bytes one micro-batch holds on this stage from the end of I until W ends: what W
    needs, the inputs of the weight matmuls (kept from F) and the gradients of their
    outputs (which I computes and hands to W), so it may exceed ``activation_bytes``
    (:mod:`pipesim.step.memory`). Omitted (None): ``activation_bytes * 16 // 17``
    (:data:`W_SHARE`, Qi et al. 2024, Table 1: ``M_W = 32sbh`` of ``M_B = 34sbh`` per
    transformer layer once the ``5as^2b`` attention scores are not stored)."""
    output_bytes: int = 0
    """Bytes of the activation sent to the next stage (the gradient sent back is as big)."""
    param_bytes: int = 0
    """Parameter bytes of this stage (reported, not simulated)."""
    optimizer: Time = 0
    """Duration of this stage's optimizer step, run once per training iteration after the
    stage's last backward (and, with data parallelism, its gradient reduction: include
    what of it is exposed). Only a run of several iterations steps the optimizer
    (:mod:`pipesim.iterations`); a single step ends at its last backward."""

    def __post_init__(self) -> None:
        for name in ("forward", "backward", "input_grad", "weight_grad", "optimizer"):
            object.__setattr__(self, name, to_time(getattr(self, name), name=name))
        if self.overlap is not None:
            object.__setattr__(self, "overlap", to_time(self.overlap, name="overlap"))
        for name in ("activation_bytes", "output_bytes", "param_bytes"):
            object.__setattr__(self, name, parse_bytes(getattr(self, name), name=name))
        kept = self.weight_grad_bytes
        if kept is None:
            kept = self.activation_bytes * W_SHARE.numerator // W_SHARE.denominator
        object.__setattr__(self, "weight_grad_bytes", parse_bytes(kept, name="weight_grad_bytes"))

    def duration(self, op: Op) -> Time:
        """The duration of ``op`` on this stage."""
        if op is Op.F:
            return self.forward
        if op is Op.B:
            return self.backward
        if op is Op.I:
            return self.input_grad
        return self.weight_grad


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """The path between two ranks: latency + bytes / bandwidth."""

    latency: Time = 0
    """Seconds (or whatever time unit the durations use) from leaving the link to arrival."""
    bandwidth_bytes_per_s: Time | None = None
    """Bytes per time unit; None means messages take no transfer time."""
    max_concurrent: int = 1
    """Messages one direction of a link carries at once."""
    send_overhead: Time = 0
    """Time the sending rank spends posting one message, after the work that produced it."""
    receive_overhead: Time = 0
    """Time the receiving rank spends taking one arrived message, before the work needing it."""
    handshake: Time = 0
    """With ``CostModel.send_mode`` ``rendezvous``: at most how long after a receive
    posted later than its send a computing sender answers it (:mod:`pipesim.engine`)."""
    post_overhead: Time = 0
    """Time the receiving rank spends posting one receive (an ``irecv``), where
    :func:`pipesim.comms.lower_comms` places its ``RECV``: after the sends of the work
    before it (:mod:`pipesim.engine`; the SimPy engine alone models it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "latency", to_time(self.latency, name="link latency"))
        for name in ("send_overhead", "receive_overhead", "handshake", "post_overhead"):
            object.__setattr__(self, name, to_time(getattr(self, name), name=f"link {name}"))
        if self.bandwidth_bytes_per_s is not None:
            object.__setattr__(
                self,
                "bandwidth_bytes_per_s",
                to_time(self.bandwidth_bytes_per_s, name="link bandwidth", allow_zero=False),
            )
        object.__setattr__(
            self, "max_concurrent", to_count(self.max_concurrent, name="max_concurrent", minimum=1)
        )

    def occupancy(self, n_bytes: int) -> Time:
        """How long a message of ``n_bytes`` holds the link."""
        if self.bandwidth_bytes_per_s is None or n_bytes == 0:
            return 0
        time = Fraction(n_bytes) / self.bandwidth_bytes_per_s
        return time.numerator if time.denominator == 1 else time

    def transfer_time(self, n_bytes: int) -> Time:
        """Latency plus occupancy: the uncontended time from send to arrival."""
        return self.latency + self.occupancy(n_bytes)

    @property
    def is_free(self) -> bool:
        """True when messages cost nothing at all (no latency, no bandwidth limit)."""
        return self.latency == 0 and self.bandwidth_bytes_per_s is None


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkPair:
    """The link from ``src`` rank to ``dst`` rank (one direction), overriding the rules."""

    src: int
    dst: int
    link: Link


@dataclass(frozen=True, slots=True, kw_only=True)
class Links:
    """Links per ordered rank pair: nodes of ``ranks_per_node`` consecutive ranks joined
    by ``intra_node``, nodes joined by ``inter_node``, and explicit ``pairs`` over both.

    A rule left out (None) falls back to :attr:`CostModel.link`.

    >>> fast, slow = Link(latency=1), Link(latency=5)
    >>> links = Links(ranks_per_node=2, intra_node=fast, inter_node=slow)
    >>> costs = CostModel(link=Link(), links=links)
    >>> costs.link_between(0, 1).latency, costs.link_between(1, 2).latency
    (1, 5)
    """

    ranks_per_node: int | None = None
    """Ranks ``k * n .. k * n + n - 1`` share node ``k``; None: no node rule."""
    intra_node: Link | None = None
    """Between two ranks of one node (NVLink, say)."""
    inter_node: Link | None = None
    """Between ranks of two nodes (InfiniBand, say)."""
    pairs: tuple[LinkPair, ...] = ()
    """Explicit links for some ordered pairs; they win over the node rule."""

    def __post_init__(self) -> None:
        if self.ranks_per_node is not None:
            object.__setattr__(
                self,
                "ranks_per_node",
                to_count(self.ranks_per_node, name="ranks_per_node", minimum=1),
            )
        object.__setattr__(self, "pairs", tuple(self.pairs))
        seen = set()
        for pair in self.pairs:
            if not isinstance(pair, LinkPair):
                raise CostError(f"links.pairs must hold LinkPair values, got {brief(pair)}")
            for name in ("src", "dst"):
                to_count(getattr(pair, name), name=f"link pair {name}")
            if (pair.src, pair.dst) in seen:
                raise CostError(
                    f"the link from rank {pair.src} to rank {pair.dst} is given twice; keep one"
                )
            seen.add((pair.src, pair.dst))

    def all_links(self) -> tuple[Link, ...]:
        """Every link these rules name."""
        rules = (self.intra_node, self.inter_node)
        return tuple(link for link in rules if link is not None) + tuple(p.link for p in self.pairs)

    def between(self, src: int, dst: int, /, *, default: Link) -> Link:
        """The link from ``src`` to ``dst``."""
        for pair in self.pairs:
            if pair.src == src and pair.dst == dst:
                return pair.link
        n = self.ranks_per_node
        if n is None:
            return default
        same_node = src // n == dst // n
        chosen = self.intra_node if same_node else self.inter_node
        return default if chosen is None else chosen


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """Per-stage costs, the links between ranks, and the device memory capacity."""

    stages: tuple[StageCost, ...] = (StageCost(),)
    """One entry per stage, or one entry for every stage."""
    link: Link = field(default_factory=Link)
    """The link between any two ranks that ``links`` does not name."""
    links: Links | None = None
    """Links per ordered rank pair (node rules, explicit pairs); None: ``link`` everywhere."""
    memory_capacity_bytes: int | None = None
    """Device memory for activations; reported against the peak, None if unknown."""
    blocking_sends: bool = False
    """Whether a SEND holds its rank until its message arrives (a blocking send);
    False: the rank runs on while the message travels."""
    dispatch_overhead: Time = 0
    """Time a rank spends on each unit of work besides its compute (the executor's code)."""
    time_unit: str = "unit"
    """What one time value stands for: ``unit`` (abstract slots), ``s``, ``ms``, ``us`` or
    ``ns`` (see :mod:`pipesim.units`); tables, plots and traces say it."""
    send_mode: str = "eager"
    """When a message leaves its sender (the rule is :mod:`pipesim.engine`'s): ``eager``
    when its send is posted; ``rendezvous`` once its receive is posted too (where
    :func:`pipesim.comms.lower_comms` places it) and, when that came second, the sender
    answered it: at once if waiting (and not woken by the poster's own message), else at
    the end of its running node or ``Link.handshake`` later (gloo's transport:
    ``docs/results/gloo-transport.md``)."""
    sync_time: Time = 0
    """Time of the optimizer's synchronization between training iterations
    (:mod:`pipesim.iterations`): the gradient-norm / inf-nan all-reduce across the
    pipeline that ``global`` sync waits for, or one pipeline hop of the partial
    reduction that ``post-validation`` passes from rank to rank."""

    def __post_init__(self) -> None:
        check_time_unit(self.time_unit)
        object.__setattr__(self, "sync_time", to_time(self.sync_time, name="sync_time"))
        if self.send_mode not in SEND_MODES:
            raise CostError(
                f"send_mode must be one of {', '.join(SEND_MODES)}, got {brief(self.send_mode)}"
            )
        object.__setattr__(
            self, "dispatch_overhead", to_time(self.dispatch_overhead, name="dispatch_overhead")
        )
        stages = tuple(self.stages) if isinstance(self.stages, tuple | list) else ()
        if not stages or not all(isinstance(s, StageCost) for s in stages):
            raise CostError(
                f"stages must be a non-empty list of StageCost, got {brief(self.stages)}"
            )
        check_range(
            len(stages), name="cost stages", maximum=MAX_STAGES, limit="MAX_STAGES", error=CostError
        )
        object.__setattr__(self, "stages", stages)
        if not isinstance(self.link, Link):
            raise CostError(f"link must be a Link, got {brief(self.link)}")
        if not isinstance(self.blocking_sends, bool):
            raise CostError(
                f"blocking_sends must be True or False, got {brief(self.blocking_sends)}"
            )
        if self.send_mode == "rendezvous" and self.blocking_sends:
            raise CostError(
                "send_mode rendezvous models posted (non-blocking) sends; it cannot be combined "
                "with blocking_sends: drop one of them"
            )
        _check_denominator(stages, self.link, self.dispatch_overhead, self.sync_time)
        if self.links is not None:
            if not isinstance(self.links, Links):
                raise CostError(f"links must be a Links value or None, got {brief(self.links)}")
            for extra in self.links.all_links():
                _check_denominator(stages, extra, self.dispatch_overhead)
        if self.memory_capacity_bytes is not None:
            object.__setattr__(
                self,
                "memory_capacity_bytes",
                parse_bytes(self.memory_capacity_bytes, name="memory_capacity_bytes", minimum=1),
            )

    @classmethod
    def uniform(
        cls,
        *,
        link: Link | None = None,
        links: Links | None = None,
        memory_capacity_bytes: int | None = None,
        blocking_sends: bool = False,
        dispatch_overhead: Time = 0,
        time_unit: str = "unit",
        send_mode: str = "eager",
        **stage_fields: Any,
    ) -> CostModel:
        """Identical stages; ``stage_fields`` are :class:`StageCost` fields."""
        return cls(
            stages=(StageCost(**stage_fields),),
            link=link or Link(),
            links=links,
            memory_capacity_bytes=memory_capacity_bytes,
            blocking_sends=blocking_sends,
            dispatch_overhead=dispatch_overhead,
            time_unit=time_unit,
            send_mode=send_mode,
        )

    @property
    def overlap_comm(self) -> bool:
        """The old name, inverted: whether sends run beside compute (not ``blocking_sends``)."""
        return not self.blocking_sends

    def link_between(self, src: int, dst: int, /) -> Link:
        """The link a message from rank ``src`` to rank ``dst`` takes."""
        if self.links is None:
            return self.link
        return self.links.between(src, dst, default=self.link)

    def for_stages(self, n_stages: int) -> CostModel:
        """This model with exactly ``n_stages`` entries (one entry is broadcast)."""
        if len(self.stages) == n_stages:
            return self
        if len(self.stages) == 1:
            return replace(self, stages=self.stages * n_stages)
        raise CostError(
            f"the cost model describes {len(self.stages)} stages but the schedule has "
            f"{n_stages}; give one value per stage or a single value for all"
        )

    def stage(self, stage: int) -> StageCost:
        """Costs of ``stage`` (the single entry when broadcast)."""
        return self.stages[0] if len(self.stages) == 1 else self.stages[stage]

    def duration(self, work: Work) -> Time:
        """How long ``work`` runs on its rank."""
        if isinstance(work, Action):
            return self.stage(work.stage).duration(work.op)
        assert isinstance(work, Overlap)
        first = self.stage(work.parts[0].stage)
        if first.overlap is not None:
            return first.overlap
        return sum((self.stage(a.stage).duration(a.op) for a in work.parts), start=0)


def _check_denominator(
    stages: tuple[StageCost, ...], link: Link, dispatch: Time, sync: Time = 0
) -> None:
    """Refuse times whose exact sums would need huge numbers: every time the engine adds
    is a multiple of one over the common denominator of the durations, the latency, the
    overheads and bytes / bandwidth (whose denominator divides the bandwidth's numerator)."""
    denominators = {1, dispatch.denominator, sync.denominator}
    denominators.update(t.denominator for t in (link.send_overhead, link.receive_overhead))
    denominators.update(t.denominator for t in (link.handshake, link.post_overhead))
    for stage in set(stages):  # broadcast models repeat one entry
        for time in (stage.forward, stage.backward, stage.input_grad, stage.weight_grad):
            denominators.add(time.denominator)
        denominators.add(stage.optimizer.denominator)
        if stage.overlap is not None:
            denominators.add(stage.overlap.denominator)
    denominators.add(link.latency.denominator)
    if link.bandwidth_bytes_per_s is not None:
        denominators.add(link.bandwidth_bytes_per_s.numerator)
    common = math.lcm(*denominators)
    if common >= 10**MAX_DENOMINATOR_DIGITS:
        raise CostError(
            f"the cost model's times need a common denominator of {brief(common)}, above "
            f"pipesim's limit of {MAX_DENOMINATOR_DIGITS} digits (MAX_DENOMINATOR_DIGITS in "
            "pipesim.limits) for exact arithmetic; round the durations, latency and bandwidth "
            "to fewer digits"
        )


def require_eager(costs: CostModel, /, *, evaluator: str) -> None:
    """Refuse ``costs`` with rendezvous sends or a receive posting cost
    (``Link.post_overhead``) in an ``evaluator`` that models eager sends and free posts
    only (the fast evaluators, the longest path, the planner): it would silently differ
    from the SimPy engine, which alone models both (:mod:`pipesim.engine`).

    >>> require_eager(CostModel(send_mode="rendezvous"), evaluator="the longest path")
    Traceback (most recent call last):
    ...
    pipesim.errors.CostError: the longest path models eager sends only, and this cost ...
    """
    if costs.send_mode != "eager":
        raise CostError(
            f"{evaluator} models eager sends only, and this cost model has send_mode "
            f"{costs.send_mode} (as pipesim calibrate --send-mode rendezvous writes it); "
            "simulate it with the SimPy engine (pipesim simulate --costs FILE), or set "
            "send_mode to eager"
        )
    links = (costs.link, *(costs.links.all_links() if costs.links is not None else ()))
    posting = [link.post_overhead for link in links if link.post_overhead]
    if posting:
        raise CostError(
            f"{evaluator} models receives posted at no cost, and this cost model has a link "
            f"post_overhead of {posting[0]}; simulate it with the SimPy engine (pipesim "
            "simulate --costs FILE), or set post_overhead to 0"
        )


# -- files ----------------------------------------------------------------------------
_STAGE_FIELDS = {f.name for f in fields(StageCost)}
_LINK_FIELDS = {f.name for f in fields(Link)}


def _blocking_sends(data: dict[str, Any], source: str) -> bool:
    """``blocking_sends``, or its old spelling ``overlap_comm`` (the opposite); both
    given must agree."""
    given = {}
    for key, blocking_when in (("blocking_sends", True), ("overlap_comm", False)):
        if key in data:
            if not isinstance(data[key], bool):
                raise ParseError(f"{source}: {key} must be true or false, got {brief(data[key])}")
            given[key] = data[key] is blocking_when
    if len(set(given.values())) > 1:
        raise ParseError(
            f"{source}: blocking_sends {str(data['blocking_sends']).lower()} and its old "
            f"spelling overlap_comm {str(data['overlap_comm']).lower()} disagree: keep "
            "blocking_sends only"
        )
    return next(iter(given.values()), False)


def costs_from_dict(data: object, /, *, source: str = "costs") -> CostModel:
    """Build a CostModel from ``{"stage": {...}}`` or ``{"stages": [{...}, ...]}`` plus
    optional ``link``, ``memory_capacity_bytes``, ``blocking_sends`` (its old spelling
    ``overlap_comm``, the opposite, is still read), ``dispatch_overhead`` and ``time_unit``
    (or ``meta.time_unit``, where ``pipesim verify`` writes it; default ``unit``)."""
    if not isinstance(data, dict):
        raise ParseError(f"{source}: expected a JSON object, got {type(data).__name__}")
    known = {
        "stage",
        "stages",
        "link",
        "links",
        "memory_capacity_bytes",
        "blocking_sends",
        "overlap_comm",
        "dispatch_overhead",
        "time_unit",
        "send_mode",
        "sync_time",
        "format",
        "meta",
    }
    unknown = sorted(map(str, set(data) - known))
    if unknown:
        raise ParseError(f"{source}: unknown keys {brief(unknown)}; valid keys are {sorted(known)}")
    if ("stage" in data) == ("stages" in data):
        raise ParseError(f"{source}: give exactly one of 'stage' (uniform) or 'stages' (a list)")
    raw_stages = [data["stage"]] if "stage" in data else data["stages"]
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ParseError(f"{source}: 'stages' must be a non-empty list of objects")
    check_range(
        len(raw_stages),
        name=f"{source}: stages",
        maximum=MAX_STAGES,
        limit="MAX_STAGES",
        error=ParseError,
    )
    stages = []
    for index, raw in enumerate(raw_stages):
        where = f"{source}: stage {index}" if "stages" in data else f"{source}: stage"
        stages.append(_build(StageCost, raw, _STAGE_FIELDS, where))
    link = _build(Link, data.get("link", {}), _LINK_FIELDS, f"{source}: link")
    links = _links_from_dict(data["links"], f"{source}: links") if "links" in data else None
    blocking_sends = _blocking_sends(data, source)
    meta = data.get("meta")
    raw_unit = data.get("time_unit", meta.get("time_unit") if isinstance(meta, dict) else None)
    try:
        unit = check_time_unit("unit" if raw_unit is None else raw_unit)
    except UnknownNameError as exc:
        raise ParseError(f"{source}: time_unit: {exc}") from None
    try:
        return CostModel(
            stages=tuple(stages),
            link=link,
            links=links,
            memory_capacity_bytes=data.get("memory_capacity_bytes"),
            blocking_sends=blocking_sends,
            dispatch_overhead=data.get("dispatch_overhead", 0),
            time_unit=unit,
            send_mode=data.get("send_mode", "eager"),
            sync_time=data.get("sync_time", 0),
        )
    except CostError as exc:
        raise CostError(f"{source}: {exc}") from None


def _links_from_dict(raw: object, where: str) -> Links:
    """``{"ranks_per_node": n, "intra_node": {link}, "inter_node": {link},
    "pairs": [{"src": r, "dst": q, ...link fields}]}``, every key optional."""
    allowed = {"ranks_per_node", "intra_node", "inter_node", "pairs"}
    if not isinstance(raw, dict):
        raise ParseError(f"{where}: expected an object, got {brief(raw)}")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ParseError(f"{where}: unknown fields {unknown}; valid fields are {sorted(allowed)}")
    rules = {
        name: _build(Link, raw[name], _LINK_FIELDS, f"{where}: {name}")
        for name in ("intra_node", "inter_node")
        if name in raw
    }
    raw_pairs = raw.get("pairs", [])
    if not isinstance(raw_pairs, list):
        raise ParseError(f"{where}: pairs must be a list of objects, got {brief(raw_pairs)}")
    pairs = []
    for index, entry in enumerate(raw_pairs):
        here = f"{where}: pairs[{index}]"
        if not isinstance(entry, dict) or "src" not in entry or "dst" not in entry:
            raise ParseError(f"{here}: give an object with src, dst and link fields")
        fields_only = {k: v for k, v in entry.items() if k not in ("src", "dst")}
        link = _build(Link, fields_only, _LINK_FIELDS, here)
        try:
            pairs.append(LinkPair(src=entry["src"], dst=entry["dst"], link=link))
        except CostError as exc:
            raise CostError(f"{here}: {exc}") from None
    try:
        return Links(ranks_per_node=raw.get("ranks_per_node"), pairs=tuple(pairs), **rules)
    except CostError as exc:
        raise CostError(f"{where}: {exc}") from None


def _build(cls: Any, raw: object, allowed: set[str], where: str) -> Any:
    if not isinstance(raw, dict):
        raise ParseError(f"{where}: expected an object, got {brief(raw)}")
    unknown = sorted(map(str, set(raw) - allowed))
    if unknown:
        raise ParseError(
            f"{where}: unknown fields {brief(unknown)}; valid fields are {sorted(allowed)}"
        )
    try:
        return cls(**raw)
    except CostError as exc:
        raise CostError(f"{where}: {exc}") from None


def costs_to_dict(costs: CostModel, /) -> dict[str, Any]:
    """The JSON-ready form of ``costs`` (times as numbers or "p/q" strings when inexact)."""

    def value(v: object) -> object:
        if isinstance(v, Fraction):
            return v.numerator if v.denominator == 1 else str(v)
        return v

    def as_dict(obj: Any, names: set[str]) -> dict[str, object]:
        return {n: value(getattr(obj, n)) for n in sorted(names) if getattr(obj, n) is not None}

    def _link_dict(link: Link) -> dict[str, object]:
        fields_of = as_dict(link, _LINK_FIELDS)
        for name in ("send_overhead", "receive_overhead", "handshake", "post_overhead"):
            # 0 left out: files stay as they were
            if not fields_of[name]:
                del fields_of[name]
        return fields_of

    data: dict[str, Any] = {"stages": [as_dict(s, _STAGE_FIELDS) for s in costs.stages]}
    for stage in data["stages"]:  # 0 left out: files stay as they were
        if not stage["optimizer"]:
            del stage["optimizer"]
    data["link"] = _link_dict(costs.link)
    if costs.links is not None:
        links: dict[str, Any] = {}
        if costs.links.ranks_per_node is not None:
            links["ranks_per_node"] = costs.links.ranks_per_node
        for name in ("intra_node", "inter_node"):
            rule = getattr(costs.links, name)
            if rule is not None:
                links[name] = _link_dict(rule)
        if costs.links.pairs:
            links["pairs"] = [
                {"src": p.src, "dst": p.dst, **_link_dict(p.link)} for p in costs.links.pairs
            ]
        data["links"] = links
    if costs.memory_capacity_bytes is not None:
        data["memory_capacity_bytes"] = costs.memory_capacity_bytes
    data["blocking_sends"] = costs.blocking_sends
    if costs.dispatch_overhead:
        data["dispatch_overhead"] = value(costs.dispatch_overhead)
    data["time_unit"] = costs.time_unit
    if costs.send_mode != "eager":
        data["send_mode"] = costs.send_mode
    if costs.sync_time:
        data["sync_time"] = value(costs.sync_time)
    return data


def load_costs(path: str | Path, /) -> CostModel:
    """Read a cost model from a JSON file (see :func:`costs_from_dict` for the shape)."""
    return costs_from_dict(read_json(path, what="cost"), source=str(path))
