"""The fast evaluator gives exactly the SimPy engine's results (the engine is the oracle)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipesim.actions import Action, Op, Overlap, Work
from pipesim.costs import CostModel, Link, LinkPair, Links, StageCost
from pipesim.engine import run_trace, simulate
from pipesim.errors import DeadlockError, PipesimError
from pipesim.graph import validate
from pipesim.plan.fastsim import compile_schedule, evaluate, fast_metrics, metrics_of
from pipesim.plan.fasttrace import fast_trace
from pipesim.plan.onepass import quick_step
from pipesim.schedule import Schedule
from pipesim.schedules import generate, schedule_names

_TIMES = st.one_of(
    st.integers(min_value=0, max_value=7),
    st.fractions(min_value=0, max_value=5, max_denominator=6),
)


@st.composite
def cost_models(draw: st.DrawFn, n_stages: int) -> CostModel:
    stages = []
    for _ in range(n_stages):
        act = draw(st.integers(min_value=0, max_value=1000))
        overlap = draw(st.one_of(st.none(), _TIMES))
        stages.append(
            StageCost(
                forward=draw(_TIMES),
                backward=draw(_TIMES),
                input_grad=draw(_TIMES),
                weight_grad=draw(_TIMES),
                overlap=overlap,
                activation_bytes=act,
                weight_grad_bytes=draw(st.integers(min_value=0, max_value=2 * act)),
                output_bytes=draw(st.integers(min_value=0, max_value=64)),
                param_bytes=draw(st.integers(min_value=0, max_value=100)),
            )
        )
    links = st.one_of(
        st.just(Link()),
        st.builds(
            Link,
            latency=_TIMES,
            bandwidth_bytes_per_s=st.one_of(
                st.none(),
                # a bounded denominator: an unbounded draw can exceed pipesim's exact-number
                # limit (MAX_NUMBER_DIGITS), which the cost model rightly refuses
                st.fractions(min_value=Fraction(1, 2), max_value=40, max_denominator=16),
            ),
            max_concurrent=st.integers(min_value=1, max_value=3),
            send_overhead=st.one_of(st.just(0), _TIMES),
            receive_overhead=st.one_of(st.just(0), _TIMES),
        ),
    )
    link = draw(links)
    # Links per rank pair: a node rule, sometimes an explicit pair on top.
    per_pair = draw(
        st.one_of(
            st.none(),
            st.builds(
                Links,
                ranks_per_node=st.integers(min_value=1, max_value=3),
                intra_node=st.one_of(st.none(), links),
                inter_node=st.one_of(st.none(), links),
                pairs=st.one_of(
                    st.just(()),
                    st.builds(
                        lambda src, dst, l: (LinkPair(src=src, dst=dst, link=l),),
                        st.integers(0, 3),
                        st.integers(0, 3),
                        links,
                    ),
                ),
            ),
        )
    )
    return CostModel(
        stages=tuple(stages),
        link=link,
        links=per_pair,
        memory_capacity_bytes=draw(st.one_of(st.none(), st.integers(1, 5000))),
        blocking_sends=draw(st.booleans()),
        dispatch_overhead=draw(st.one_of(st.just(0), _TIMES)),
    )


def _random_schedule(seed: int) -> Schedule:
    """A random valid schedule: any placement, B or I+W per stage and micro-batch,
    per-rank orders cut from one random topological order, some overlapped pairs and
    some extra happens_before edges."""
    rng = random.Random(seed)
    n_ranks = rng.randint(1, 4)
    n_stages = rng.randint(1, 6)
    n_mb = rng.randint(1, 4)
    placement = [rng.randrange(n_ranks) for _ in range(n_stages)]
    for rank in range(n_ranks):  # every rank holds at least one stage
        if rank not in placement:
            placement[rng.randrange(n_stages)] = rank
    if len(set(placement)) < n_ranks:
        n_ranks = len(set(placement))
        relabel = {r: i for i, r in enumerate(sorted(set(placement)))}
        placement = [relabel[r] for r in placement]
    forward_only = rng.random() < 0.15
    needs: dict[Action, list[Action]] = {}
    for mb in range(n_mb):
        split = {s: rng.random() < 0.5 for s in range(n_stages)}
        for s in range(n_stages):
            f = Action(stage=s, op=Op.F, microbatch=mb)
            needs[f] = [Action(stage=s - 1, op=Op.F, microbatch=mb)] if s else []
            if forward_only:
                continue
            grad_op = Op.I if split[s] else Op.B
            g = Action(stage=s, op=grad_op, microbatch=mb)
            later = []
            if s + 1 < n_stages:
                later = [Action(stage=s + 1, op=Op.I if split[s + 1] else Op.B, microbatch=mb)]
            needs[g] = [f, *later]
            if split[s]:
                needs[Action(stage=s, op=Op.W, microbatch=mb)] = [g]
    done: set[Action] = set()
    global_order: list[Action] = []
    pending = sorted(needs, key=str)
    while pending:
        choices = [a for a in pending if all(n in done for n in needs[a])]
        pick = rng.choice(choices)
        pending.remove(pick)
        done.add(pick)
        global_order.append(pick)
    orders: list[list[Work]] = [[] for _ in range(n_ranks)]
    for action in global_order:
        orders[placement[action.stage]].append(action)
    for order in orders:  # merge a few neighbours into overlapped works
        k = 0
        while k + 1 < len(order):
            a, b = order[k], order[k + 1]
            if isinstance(a, Action) and isinstance(b, Action) and rng.random() < 0.15:
                order[k : k + 2] = [Overlap(parts=(a, b))]
            k += 1
    position = {a: i for i, a in enumerate(global_order)}
    extra = []
    for _ in range(rng.randint(0, 3)):
        a, b = rng.sample(global_order, 2) if len(global_order) > 1 else (None, None)
        if a is None or b is None:
            break
        if position[a] > position[b]:
            a, b = b, a
        if placement[a.stage] != placement[b.stage]:
            extra.append((a, b))
    return Schedule.from_orders(
        orders, placement=placement, n_microbatches=n_mb, happens_before=extra
    )


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**9), data=st.data())
def test_random_schedules_give_the_engines_trace_and_metrics(
    seed: int, data: st.DataObject
) -> None:
    schedule = _random_schedule(seed)
    try:
        validate(schedule)
    except PipesimError:
        assume(False)  # an overlapped pair can wait on itself through another rank
    costs = data.draw(cost_models(schedule.n_stages))
    assert fast_trace(schedule, costs) == run_trace(schedule, costs)
    assert fast_metrics(schedule, costs=costs) == simulate(schedule, costs=costs).metrics


@st.composite
def registered_steps(draw: st.DrawFn) -> tuple[Schedule, CostModel]:
    """A registered schedule at a size its rules accept, and random costs for it."""
    name = draw(st.sampled_from(schedule_names()))
    n_ranks, n_mb, virtual = (
        draw(st.integers(1, 5)),
        draw(st.integers(1, 10)),
        draw(st.integers(1, 3)),
    )
    try:
        schedule = generate(name, n_ranks=n_ranks, n_microbatches=n_mb, virtual=virtual)
    except PipesimError:
        assume(False)
    return schedule, draw(cost_models(schedule.n_stages))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(step=registered_steps())
def test_registered_schedules_give_the_engines_metrics(step: tuple[Schedule, CostModel]) -> None:
    schedule, costs = step
    assert fast_metrics(schedule, costs=costs) == simulate(schedule, costs=costs).metrics
    assert fast_trace(schedule, costs) == run_trace(schedule, costs)


def test_closed_form_and_contention_hand_case() -> None:
    """Two messages on one link: the second waits for the first (hand-computed)."""
    # rank 0 runs 0F0, 0F1 (1 each); both go to rank 1 over a link that holds a message 3.
    schedule = Schedule.from_orders([["0F0", "0F1"], ["1F0", "1F1"]], n_microbatches=2)
    costs = CostModel.uniform(
        forward=1, output_bytes=6, link=Link(bandwidth_bytes_per_s=2, latency=1)
    )
    trace = fast_trace(schedule, costs)
    # 0F0 ends 1, link 1..4, arrives 5; 0F1 ends 2, waits for the link 4..7, arrives 8
    assert [(t.start, t.end) for t in trace.transfers] == [(1, 5), (4, 8)]
    assert trace.makespan == 9
    assert evaluate(compile_schedule(schedule), costs).makespan == 9


def test_deadlock_is_reported_like_the_engine() -> None:
    schedule = Schedule.from_orders([["0B0", "0F0"], ["1F0", "1B0"]])
    with pytest.raises(DeadlockError) as fast:
        compile_schedule(schedule)
    with pytest.raises(DeadlockError) as reference:
        run_trace(schedule, CostModel())
    assert fast.value.cycle == reference.value.cycle


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(step=registered_steps())
def test_one_pass_evaluator_matches_the_engine(step: tuple[Schedule, CostModel]) -> None:
    schedule, costs = step
    quick = quick_step(schedule, costs)  # overlapped works (DualPipe) included
    assert quick is not None
    assert quick == evaluate(compile_schedule(schedule), costs)
    assert metrics_of(schedule, costs, quick) == simulate(schedule, costs=costs).metrics


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**9), data=st.data())
def test_one_pass_evaluator_on_random_schedules(seed: int, data: st.DataObject) -> None:
    schedule = _random_schedule(seed)
    try:
        validate(schedule)
    except PipesimError:
        assume(False)
    costs = data.draw(cost_models(schedule.n_stages))
    quick = quick_step(schedule, costs)
    compiled = evaluate(compile_schedule(schedule), costs)
    if quick is None:  # only overlapped works it does not take (with happens_before)
        assert any(isinstance(w, Overlap) for o in schedule.orders for w in o)
    else:
        assert quick == compiled
    assert metrics_of(schedule, costs, compiled) == simulate(schedule, costs=costs).metrics


@pytest.mark.parametrize("n_ranks", [2, 3])
def test_one_pass_evaluator_keeps_happens_before(n_ranks: int) -> None:
    # forward-only sequential: rank 0 starts micro-batch k+1 only after the last stage's
    # forward of micro-batch k (happens_before signals across ranks)
    schedule = generate("sequential", n_ranks=n_ranks, n_microbatches=3, forward_only=True)
    assert schedule.happens_before
    costs = CostModel.uniform(forward=2, link=Link(latency=1))
    quick = quick_step(schedule, costs)
    assert quick is not None
    reference = simulate(schedule, costs=costs).metrics
    assert metrics_of(schedule, costs, quick) == reference
    # 3 micro-batches one after another: p forwards of 2 and p - 1 hops of 1 each
    assert reference.makespan == 3 * (n_ranks * 2 + (n_ranks - 1))
