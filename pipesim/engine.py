"""The SimPy model of one pipeline step: rank processes, link resources, memory.

It reads the compiled step (:mod:`pipesim.step`): one SimPy process per rank
runs its order; before each unit of work it waits for the arrivals that work
needs (activations from the previous stage, gradients from the next,
``happens_before`` signals), then holds the rank for the work's duration. When
work ends, each message it produces for another rank is sent over that ordered
pair's link, a ``simpy.Resource`` holding ``max_concurrent`` messages at once
(see :mod:`pipesim.costs` for the link model).

Each rank keeps its own clock, the end of its last unit of work. A signal, or a
message on a free link, arrives exactly when its producer ends (an overlapped pair's
first message a send overhead earlier: :func:`pipesim.step.send_leads`), so its arrival
time is known as soon as the producer's rank reaches the producer; a rank whose
next work needs only arrivals of known time starts it at the latest of its clock
and those times, with no SimPy event, and yields only when an arrival's time is
not known yet (it waits on an event its producer triggers). Start times are
maxima and sums of exact numbers, so the order in which SimPy interleaves the
ranks changes none of them. A message on a link that costs time is carried by a
process of its own in simulated time: its rank first waits (a timeout) until its
clock, so that a link serves its messages in the order and at the times they are
sent, and the message's arrival time is known only when it arrives.

Activation memory per rank changes by each work's memory effect
(:mod:`pipesim.step.memory`) when it starts and when it ends.

A comms schedule (:class:`pipesim.comms.CommSchedule`) runs its sends and
receives as nodes of their own, in program order (:func:`pipesim.step.structure.step_structure`):

- **eager (buffered) send**: a SEND holds its rank for the link's
  ``send_overhead``, then hands the message to the link and the rank moves on;
  the message waits for its link and travels without the rank. It never waits
  for the receiver to post its RECV (no rendezvous). This is what torch's runtime
  does, ``_PipelineScheduleRuntime`` posting ``SEND_F`` / ``SEND_B`` as
  ``batch_isend_irecv`` and waiting on them only at the end of the step, and what
  torch's dry run ``_simulate_comms_compute`` assumes (a SEND is ready once its
  producer ran on the rank). With ``blocking_sends`` the SEND holds the rank
  until the message arrives (a blocking send, as gloo's ``send``).
- **blocking receive** (the default): a RECV waits, holding its rank, until the
  message has arrived, then holds it ``receive_overhead`` more; the work that
  needs the message comes after it in program order (``_simulate_comms_compute``:
  a RECV is ready once the peer issued the SEND; a blocking ``recv`` in gloo).
- **posted receive** (``blocking_receives=False``): a RECV only posts an ``irecv``
  (no time) and the work that needs the message waits for it when it starts, then
  pays ``receive_overhead`` for taking it (:func:`pipesim.step.comm_durations`).
  torch's ``_PipelineScheduleRuntime`` runs a comms schedule this way (``RECV_F``
  posts into ``fwd_recv_ops``, waited on by the F that needs it), and so does
  ``pipesim verify`` (:mod:`verify.transport`: the header is waited for and checked
  where the message is used). Every unit of work then starts when it does in the
  compute schedule, overheads and latencies included: that schedule's work pays its
  receive overheads once the messages have arrived too, and a unit that sends two
  messages (an overlapped F&B pair) lets the first leave once its own send overhead
  is paid (:func:`pipesim.step.send_leads`), as its SENDs do here. Blocking
  receives can cost more where the
  lowering puts a RECV ahead of work that does not need it
  (``tests/test_comms_engine.py`` measures by how much).

**Rendezvous sends** (``CostModel.send_mode`` ``rendezvous``, compute and comms
schedules alike): a message leaves once its send is posted *and* its receive is, the
receive posted where :func:`pipesim.comms.lower_comms` places the RECV (in a comms
schedule, where its program does) when the rank gets there. A receive posted after its
send is answered at once by a sender that waits, else when the sender's running node
ends or ``Link.handshake`` after the receive, whichever is first; a sender waiting for a
message the poster sent since its last unit of work is waking up: it runs the node that
needs it first, and answers as a computing sender (:class:`_Rendezvous` states it, with
the measurements).
**Posting a receive** (``Link.post_overhead``, compute schedules): after a node and its
sends, the rank posts the receives the lowering puts there, one after the other, each
holding it ``post_overhead`` (in a comms schedule its RECV node holds it,
:func:`pipesim.step.cost_tables.comm_durations`); a rendezvous receive counts as posted when
its posting begins.
This is the one place the message timing rule is written; the fast evaluators and the
longest path model eager sends only and refuse rendezvous costs
(:func:`pipesim.costs.require_eager`).

NCCL's ``ncclSend`` may not complete before the peer posts the matching
``ncclRecv`` (a rendezvous on the GPU stream, not on the rank's compute);
:func:`pipesim.comms.validate_comms` refuses any order that would deadlock even
when every send and receive waits for its peer, so an accepted comms schedule
finishes under both semantics.

Times are whatever exact numbers the cost model holds (ints or Fractions);
SimPy only adds and compares them, so results are exact.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, cast

import simpy

from pipesim.comms import CommSchedule, receive_posts, validate_comms
from pipesim.costs import CostModel
from pipesim.exact import Time
from pipesim.graph import check_structure
from pipesim.metrics import Metrics, compute_metrics
from pipesim.nogc import paused_gc
from pipesim.schedule import Schedule
from pipesim.step import CompiledStep, compile_step, send_order
from pipesim.step.deadlock import deadlock_error
from pipesim.step.memory import held_levels, rank_peaks
from pipesim.step.structure import StepStructure, step_structure
from pipesim.trace import (
    ActionRecord,
    CommRecord,
    MemoryRecord,
    Trace,
    TraceTotals,
    TransferRecord,
)

__all__ = ["Simulation", "run_compiled", "run_trace", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Simulation:
    """The result of :func:`simulate`: inputs, the trace and its metrics."""

    schedule: Schedule
    costs: CostModel
    trace: Trace
    metrics: Metrics
    comms: CommSchedule | None = None
    """The comms schedule simulated, when its sends and receives were explicit."""


def simulate(
    schedule: Schedule | CommSchedule,
    /,
    *,
    costs: CostModel | None = None,
    check: bool = True,
    blocking_receives: bool = True,
) -> Simulation:
    """Simulate one step of ``schedule`` under ``costs`` (default: unit forward,
    backward 2, free links).

    ``check`` runs :func:`pipesim.graph.validate` first, so an invalid schedule
    is refused before any simulation; the engine also reports a run that
    cannot finish as a :class:`~pipesim.errors.DeadlockError`. A
    :class:`~pipesim.comms.CommSchedule` runs its sends and receives where its
    programs place them (semantics in the module docstring; ``blocking_receives``
    chooses blocking or posted receives), checked with
    :func:`~pipesim.comms.validate_comms`.

    >>> from pipesim.comms import lower_comms
    >>> from pipesim.schedules import generate
    >>> sim = simulate(generate("1f1b", n_ranks=4, n_microbatches=8))
    >>> sim.metrics.makespan, sim.metrics.bubble_ratio  # (m+p-1)(F+B), (p-1)/(m+p-1)
    (33, Fraction(3, 11))
    >>> comms = lower_comms(sim.schedule)  # explicit SEND / RECV actions, free here
    >>> simulate(comms, blocking_receives=False).metrics.makespan  # torch's posted irecv
    33
    >>> simulate(comms).metrics.makespan  # blocking: some RECV comes before work it delays
    45
    """
    comms = schedule if isinstance(schedule, CommSchedule) else None
    sched = schedule.schedule if isinstance(schedule, CommSchedule) else schedule
    costs = (costs or CostModel()).for_stages(sched.n_stages)
    with paused_gc():
        if comms is not None:
            if check:
                validate_comms(comms)
            structure = step_structure(
                sched, programs=comms.programs, blocking_receives=blocking_receives
            )
        else:
            structure = step_structure(sched)
            if check:  # a cycle of waits, the run itself finds: validate's error, unchanged
                check_structure(sched, structure, cycles=False)
        trace = _run(compile_step(structure, costs), name_blocked=comms is not None or not check)
    return Simulation(
        schedule=sched,
        costs=costs,
        trace=trace,
        metrics=compute_metrics(trace, schedule=sched, costs=costs),
        comms=comms,
    )


def run_trace(schedule: Schedule, costs: CostModel, /) -> Trace:
    """Run the SimPy model and return the raw :class:`Trace` (no validation)."""
    with paused_gc():
        return _run(compile_step(schedule, costs))


def run_compiled(step: CompiledStep, /, *, release: Sequence[Time] | None = None) -> Trace:
    """Run the SimPy model on an already compiled step (no validation): for callers that
    set per-node durations themselves (:func:`pipesim.calibration.replay`). ``release``
    gives per rank the time its first work may start (default 0 everywhere): one
    training iteration after the previous one's optimizer step (:mod:`pipesim.iterations`)."""
    with paused_gc():
        return _run(step, release=release)


def _run(
    step: CompiledStep, *, name_blocked: bool = True, release: Sequence[Time] | None = None
) -> Trace:
    """Run the step; a run that cannot finish is :func:`deadlock_error`, naming where each
    stuck rank waits when ``name_blocked``. Each rank's clock starts at its ``release``
    time (0 without)."""
    run = _RunState(step, release=release)
    for rank, program in enumerate(step.structure.programs):
        run.env.process(run.run_rank(rank, program))
    run.env.run()
    stuck = [rank for rank in range(run.n_ranks) if run.waiting_at[rank] != _DONE]
    if stuck:
        blocked = [run.waiting_at[rank] for rank in stuck] if name_blocked else []
        raise deadlock_error(step.structure, blocked=blocked)
    left = run.rendezvous.times if run.rendezvous is not None else None
    return _trace(step, run.starts, run.ends, run.links, run.blocked_at, left, release)


_DONE = -2
"""``_RunState.waiting_at`` of a rank that ran its whole program."""


class _RunState:
    """One run of the engine: its SimPy environment, what it has found so far (per node
    its start and end, per arrival its time), and the rules it reads from the compiled
    step. :meth:`run_rank` is the process of one rank."""

    def __init__(self, step: CompiledStep, *, release: Sequence[Time] | None) -> None:
        structure = step.structure
        self.env: Any = simpy.Environment()  # typed by simpy as float time; ours is exact
        self.step = step
        self.n_ranks = structure.schedule.n_ranks
        self.release = release
        """Per rank when its first work may start (None: 0 everywhere)."""
        self.starts, self.ends, self.arrival_at = _time_columns(step)
        """Per node its start and end; per arrival (message or signal) its arrival time
        once known (-1 before)."""
        self.waiters: list[Any] = [None] * structure.n_arrivals
        """Per arrival the event its consumer waits on: made only if it blocks, dropped
        once it fired."""
        self.on_link = _on_link(step)
        """Per arrival, 1 for a message whose link costs time."""
        self.links = _Links(self.env, step, self.deliver) if any(self.on_link) else None
        self.rendezvous = (
            _Rendezvous(self.env, step, self.links, self.deliver)
            if step.costs.send_mode != "eager"
            else None
        )
        self.waiting_at = [-1] * self.n_ranks
        """Per rank the node it last blocked at; ``_DONE`` once it ran its program."""
        self.blocked_at: dict[int, Time] = {}
        """Node -> when its rank began to wait for it (only sends and receives report it,
        ``CommRecord.posted``)."""
        self.posts = (
            self.rendezvous.posts
            if self.rendezvous is not None
            else (posted_after(structure) if any(step.posting) else None)
        )
        """Per node (-1: before a rank's first) the receives posted after it; None when
        posting costs nothing and no send waits for it (``Link.post_overhead``,
        :func:`pipesim.step.cost_tables.post_times`)."""
        self.receivers = [m.dst_rank for m in structure.messages]
        """Per message its receiving rank."""
        self.leads = step.leads if self.rendezvous is None else {}
        """Messages that leave before their producer ends (:func:`pipesim.step.send_leads`;
        a rendezvous send leaves when its producer ends and its receive is posted)."""
        self.early = send_order(structure, self.leads)
        """Such a producer's outputs in the order they leave."""

    def deliver(self, arrival: int) -> None:
        """A link's message arrives now."""
        self.arrival_at[arrival] = self.env.now
        waiter = self.waiters[arrival]
        if waiter is not None:
            waiter.succeed()

    def run_rank(self, rank: int, order: Sequence[int]) -> Any:
        """The SimPy process of ``rank``: run ``order`` (semantics in the module docstring).

        The hot loop of the engine: it reads the run state through locals (attribute
        reads per node would cost a tenth of its speed)."""
        env, timeout, event = self.env, self.env.timeout, self.env.event
        step, structure = self.step, self.step.structure
        durations = step.durations
        inputs, outputs = structure.inputs, structure.outputs
        starts, ends, arrival_at, waiters = self.starts, self.ends, self.arrival_at, self.waiters
        waiting_at, blocked_at, posts = self.waiting_at, self.blocked_at, self.posts
        on_link, links, rendezvous = self.on_link, self.links, self.rendezvous
        leads, early, n_messages = self.leads, self.early, structure.n_messages
        has_comms, blocking_sends = bool(structure.comms), step.costs.blocking_sends
        # The rank's own clock: when its last node ended. It runs ahead of env.now while
        # every arrival its work needs has a known time (see the module docstring).
        clock: Time = 0 if self.release is None else self.release[rank]
        if posts is not None and -1 in posts:  # receives posted before the rank's first node
            mine = [m for m in posts[-1] if self.receivers[m] == rank]
            clock = yield from self.post_receives(mine, clock)
        for node in order:
            start = clock
            for arrival in inputs[node]:
                at = arrival_at[arrival]
                if at < 0:
                    waiting_at[rank] = node
                    waiters[arrival] = event()
                    yield waiters[arrival]
                    waiters[arrival] = None
                    at = arrival_at[arrival]
                if at > start:
                    start = at
            if has_comms and start != clock:
                blocked_at[node] = clock
            starts[node] = start
            ends[node] = clock = start + durations[node]
            if rendezvous is not None:
                # Rendezvous: the rank keeps to simulated time, so that a receive posted to
                # it finds it inside a node or not (_Rendezvous), at one timeout per node.
                if start != env.now:
                    yield timeout(start - env.now)
                rendezvous.begin(rank, clock)
                if clock != env.now:
                    yield timeout(clock - env.now)
                rendezvous.answer(rank, node)
            sending = None
            # An overlapped pair's first message leaves before its end (send_leads).
            for arrival in early[node] if early and node in early else outputs[node]:
                if rendezvous is not None and arrival < n_messages:
                    rendezvous.send(arrival)
                    continue
                leaves = clock - leads[arrival] if leads and arrival in leads else clock
                if on_link[arrival]:
                    assert links is not None
                    if leaves != env.now:
                        yield timeout(leaves - env.now)  # a link is taken in time order
                    sending = links.send(arrival, sending)
                    continue
                arrival_at[arrival] = leaves  # a signal, or a message on a free link
                waiter = waiters[arrival]
                if waiter is not None:
                    waiter.succeed()
            if sending and blocking_sends:
                # Wait on the send processes, not the waiter: the consumer may own it.
                yield from sending
                clock = env.now
            if posts is not None and node in posts:
                # After its sends, the rank posts the receives the lowering puts here.
                clock = yield from self.post_receives(posts[node], clock)
        waiting_at[rank] = _DONE

    def post_receives(self, messages: Sequence[int], clock: Time) -> Any:
        """Post ``messages``' receives from ``clock`` on, one after the other, each paying
        its posting time; returns when the rank is done."""
        env, rendezvous, posting = self.env, self.rendezvous, self.step.posting
        for message in messages:
            if rendezvous is not None:
                if clock != env.now:
                    yield env.timeout(clock - env.now)
                rendezvous.post((message,))
            if posting:
                clock += posting[message]
        return clock


def answers_at_node_end(posted: Time, begins: Time, ends: Time, /, *, woken: bool) -> bool:
    """The rendezvous answer rule (:class:`_Rendezvous`): whether a sender answers a receive
    posted at ``posted``, after its message was sent, at the end of its node running from
    ``begins`` to ``ends``: it is inside the node, or starts it no earlier than the
    receive, ``woken`` by a message its poster sent since its last unit of work (it runs
    that node first). Otherwise it answers at once, or its next node is judged. A tie is
    no later: a sender whose node ends when the receive is posted, or starts one then, is
    judged by the node it runs next, whatever the order SimPy runs equal-time events in.
    The engine applies it as it runs; :mod:`pipesim.calibration` inverts it from measured
    steps.

    >>> answers_at_node_end(5, 0, 10, woken=False), answers_at_node_end(10, 0, 10, woken=False)
    (True, False)
    >>> answers_at_node_end(5, 5, 9, woken=True), answers_at_node_end(5, 5, 9, woken=False)
    (True, False)
    """
    return begins < posted < ends or (posted <= begins and woken)


def _senders(structure: StepStructure) -> list[int]:
    """Per message, the node whose end hands it to its link: its SEND in a comms schedule,
    else its producer."""
    senders = list(structure.producers)
    if structure.explicit_comms:
        for j, message in enumerate(structure.comm_messages, start=structure.n_nodes):
            if message >= 0 and structure.step(j).op.is_send:  # type: ignore[union-attr]
                senders[message] = j
    return senders


def _on_link(step: CompiledStep) -> bytearray:
    """Per arrival, 1 for a message whose link costs time (a free link delivers at once)."""
    structure = step.structure
    on_link = bytearray(structure.n_arrivals)
    free = [link.is_free for link in step.pair_links]
    if not all(free):
        for message, pair in enumerate(structure.pair_of):
            if not free[pair]:
                on_link[message] = 1
    return on_link


def _time_columns(
    step: CompiledStep,
) -> tuple[MutableSequence[Time], MutableSequence[Time], MutableSequence[Time]]:
    """A zeroed start and end per node, and an arrival time per arrival (-1: not known
    yet): 8 bytes each when every time is an integer that fits (no time exceeds the sum
    of every duration and every message time), else lists."""
    structure = step.structure
    n_nodes, n_arrivals = structure.n_steps, structure.n_arrivals
    # The node durations themselves, not the tables: a caller may have set its own
    # (pipesim.calibration.replay, through run_compiled).
    links = step.pair_links
    small = {*step.durations, *step.occupancy, *(link.latency for link in links)}
    if step.costs.send_mode != "eager":  # a message may wait one handshake (_Rendezvous)
        small.update(link.handshake for link in links)
    if all(type(t) is int for t in small):
        bound = sum(step.durations) + sum(step.occupancy) + sum(step.latency)
        if step.costs.send_mode != "eager":
            bound += max((link.handshake for link in links), default=0) * structure.n_messages
        if bound < 2**62:
            zeros = cast("MutableSequence[Time]", array("q", bytes(8 * n_nodes)))
            unknown = cast("MutableSequence[Time]", array("q", [-1]) * n_arrivals)
            return zeros, zeros[:], unknown
    return [0] * n_nodes, [0] * n_nodes, [-1] * n_arrivals


def posted_after(structure: StepStructure, /) -> dict[int, list[int]]:
    """Per node (-1: before its rank's first), the messages whose receives its rank posts
    after it (:func:`pipesim.comms.receive_posts`), in message order: the order of the
    lowering's ``RECV`` actions there."""
    posts: dict[int, list[int]] = {}
    for message, node in enumerate(receive_posts(structure)):
        posts.setdefault(node, []).append(message)
    return posts


class _Rendezvous:
    """Rendezvous sends (``CostModel.send_mode``): a message leaves once its send has been
    posted (its producer, or its SEND node, ended) and its receive too (the receiving rank
    finished the node before the RECV, :func:`pipesim.comms.receive_posts`). When the
    receive came second, the sender answers it: at once if it is waiting (inside no
    node), else when its running node ends or ``Link.handshake`` after the receive,
    whichever comes first. A sender that waits for a message the poster sent since its
    last unit of work (the poster sends, then posts) is waking up: it runs the node that
    needs that message first and answers as above, at that node's end or a handshake
    after the receive. Then the message takes its link (occupancy, latency) as an eager
    one does.

    gloo's TCP transport pairs sends and receives so: a send whose receive is not posted
    waits for the receiver's notice (``Pair::onNotifyRecvReady``), which the sender's
    progress thread answers; while the sender's own thread computes, that thread waits
    for a core. A sender woken by the poster's own message is no waiting one: its main
    thread runs first, the progress thread after it. The measurements behind each part
    of the rule (``benchmarks/fidelity_offline.py --messages``) are in
    ``docs/results/gloo-transport.md``."""

    def __init__(
        self, env: Any, step: CompiledStep, links: _Links | None, deliver: Callable[[int], None]
    ) -> None:
        self.env, self.step, self.links, self.deliver = env, step, links, deliver
        self.on_link = _on_link(step)
        n_messages = step.structure.n_messages
        self.sent: list[Time | None] = [None] * n_messages
        self.posted = bytearray(n_messages)
        self.left = bytearray(n_messages)
        self.answering: dict[int, list[tuple[int, int]]] = {}
        """Per sending rank, the messages whose receives came after their sends, not yet
        answered, each with the node whose end answers it."""
        self.senders = _senders(step.structure)
        n_ranks = step.structure.schedule.n_ranks
        self.since: list[Time] = [-1] * n_ranks
        """Per rank, when it last started a node."""
        self.until: list[Time] = [-1] * n_ranks
        """Per rank, when the node it last started ends."""
        self.inside = bytearray(n_ranks)
        """Per rank, 1 while it runs a node."""
        self.begun = [0] * n_ranks
        """Per rank, how many nodes of its program it has started."""
        self.work_ended: list[Time] = [-1] * n_ranks
        """Per rank, when its last unit of work (not a send or receive) ended."""
        self.left_at: list[Time] = [-1] * n_messages
        """Per message, when it left (-1: not yet)."""
        self.posts = posted_after(step.structure)
        """Node (-1: the start) -> the messages whose receives are posted when it ends."""
        self.times: tuple[dict[int, Time], dict[int, Time]] = ({}, {})
        """When each message on a free link left and arrived (the links time their own)."""

    def send(self, message: int) -> None:
        self.sent[message] = self.env.now
        if self.posted[message]:
            self._leave(message)

    def post(self, messages: Sequence[int]) -> None:
        for message in messages:
            self.posted[message] = 1
            sent = self.sent[message]
            if sent is None:
                continue
            pair = self.step.structure.pair_of[message]
            handshake = self.step.pair_links[pair].handshake
            node = self._answered_by(message) if handshake and sent < self.env.now else -1
            if node >= 0:
                later = self.env.timeout(handshake)
                later.callbacks.append(lambda _, m=message: self._leave(m))
                rank = self.step.structure.rank_of_node(self.senders[message])
                self.answering.setdefault(rank, []).append((node, message))
            else:
                self._leave(message)

    def _answered_by(self, message: int) -> int:
        """The node whose end answers ``message``'s receive, posted now after its send
        (:func:`answers_at_node_end`): the node its sender runs, or the node it runs next
        when woken for it; -1: answered now."""
        structure, now = self.step.structure, self.env.now
        rank = structure.rank_of_node(self.senders[message])
        position = self.begun[rank]
        program = structure.programs[rank]
        if self.inside[rank]:
            if answers_at_node_end(now, self.since[rank], self.until[rank], woken=False):
                return program[position - 1]
            if self.since[rank] == now:  # the node it starts now is the one it runs next
                position -= 1
        if position >= len(program):
            return -1
        node = program[position]
        # The node it runs next begins now at the earliest (its end is not known yet).
        return node if answers_at_node_end(now, now, now, woken=self._woken(node, message)) else -1

    def _woken(self, node: int, message: int) -> bool:
        """Whether ``node`` takes a message that ``message``'s poster sent since its last
        unit of work (the poster sends, then posts): its sender is waking up for it."""
        structure = self.step.structure
        poster = structure.messages[message].dst_rank
        window = self.work_ended[poster]
        for arrival in structure.inputs[node]:
            if (
                arrival < structure.n_messages
                and structure.messages[arrival].src_rank == poster
                and self.left_at[arrival] >= window >= 0
            ):
                return True
        return False

    def begin(self, rank: int, until: Time) -> None:
        """``rank`` starts a node now that ends at ``until``."""
        self.since[rank] = self.env.now
        self.until[rank] = until
        self.inside[rank] = 1
        self.begun[rank] += 1

    def answer(self, rank: int, node: int) -> None:
        """``rank`` ended ``node``: the late receives it answers leave."""
        self.inside[rank] = 0
        if node < self.step.structure.n_nodes:
            self.work_ended[rank] = self.env.now
        waiting = self.answering.get(rank)
        if waiting:
            self.answering[rank] = [(n, m) for n, m in waiting if n != node]
            for n, m in waiting:
                if n == node:
                    self._leave(m)

    def _leave(self, message: int) -> None:
        if self.left[message]:
            return
        self.left[message] = 1
        self.left_at[message] = self.env.now
        if self.on_link[message]:
            assert self.links is not None
            self.links.send(message, None)
            return
        self.times[0][message] = self.times[1][message] = self.env.now
        self.deliver(message)


class _Links:
    """The links that cost time: per rank pair a ``simpy.Resource``, and per message when
    it got its link and when it arrived."""

    def __init__(self, env: Any, step: CompiledStep, deliver: Callable[[int], None]) -> None:
        self.env = env
        self.step = step
        self.deliver = deliver
        self.resources: list[simpy.Resource | None] = [None] * len(step.pair_links)
        self.start: dict[int, Time] = {}
        self.end: dict[int, Time] = {}

    def send(self, message: int, sending: list[Any] | None) -> list[Any]:
        """Start the process that carries ``message``; add it to ``sending``."""
        process = self.env.process(self._carry(message))
        if sending is None:
            return [process]
        sending.append(process)
        return sending

    def _carry(self, message: int) -> Any:
        step, env = self.step, self.env
        pair = step.structure.pair_of[message]
        resource = self.resources[pair]
        if resource is None:
            capacity = step.pair_links[pair].max_concurrent
            resource = self.resources[pair] = simpy.Resource(env, capacity=capacity)
        with resource.request() as request:
            yield request
            start = env.now
            if step.occupancy[message]:
                yield env.timeout(step.occupancy[message])
        if step.latency[message]:
            yield env.timeout(step.latency[message])
        self.start[message] = start
        self.end[message] = env.now
        self.deliver(message)


def _trace(
    step: CompiledStep,
    starts: Sequence[Time],
    ends: Sequence[Time],
    links: _Links | None,
    blocked_at: Mapping[int, Time],
    left: tuple[dict[int, Time], dict[int, Time]] | None = None,
    release: Sequence[Time] | None = None,
) -> Trace:
    structure = step.structure
    durations = step.durations
    idle_end = [0] * len(structure.programs) if release is None else release
    finish = [
        ends[program[-1]] if program else idle_end[rank]
        for rank, program in enumerate(structure.programs)
    ]
    if structure.comms:
        busy = tuple(sum([durations[n] for n in p], start=0) for p in structure.programs)
    else:  # a rank's nodes are consecutive
        busy = tuple(sum(durations[o.start : o.stop], start=0) for o in structure.orders)
    # A rank's memory changes in its program order whatever the times (pipesim.step.memory).
    peak_bytes, peak_inflight = rank_peaks(step.effects, structure.orders)
    totals = TraceTotals(
        makespan=max((*finish, *(links.end.values() if links else ()))),
        busy=busy,
        peak_activation_bytes=peak_bytes,
        peak_inflight=peak_inflight,
    )
    link_times = (links.start, links.end) if links else ({}, {})
    if left is not None:  # rendezvous: free-link messages leave when their receive is posted
        link_times = ({**link_times[0], **left[0]}, {**link_times[1], **left[1]})
    return Trace.deferred(
        n_ranks=structure.schedule.n_ranks,
        actions=lambda: action_records(structure, starts, ends),
        transfers=lambda: _transfer_records(step, ends, *link_times),
        memory=lambda: memory_records(step, starts, ends),
        comms=lambda: comm_records(step, starts, ends, blocked_at),
        totals=totals,
    )


# Records are made only when a caller reads them: for a large step, most of the cost
# of a trace. Sorting uses C-level keys (itemgetter); it is the hot spot here.
_BY_TIME_THEN_RANK = itemgetter(0, 1)


def action_records(
    structure: StepStructure, starts: Sequence[Time], ends: Sequence[Time]
) -> tuple[ActionRecord, ...]:
    """Records of every node's run, sorted by (start, rank); a rank's equal starts (zero
    durations) stay in program order, the order the engine finishes them."""
    rows = [(starts[n], rank, n) for rank, order in enumerate(structure.orders) for n in order]
    rows.sort(key=_BY_TIME_THEN_RANK)
    works = structure.works
    return tuple(
        [
            ActionRecord(rank=rank, work=works[node], start=start, end=ends[node])
            for start, rank, node in rows
        ]
    )


def comm_records(
    step: CompiledStep,
    starts: Sequence[Time],
    ends: Sequence[Time],
    blocked_at: Mapping[int, Time],
) -> tuple[CommRecord, ...]:
    """Records of a comms schedule's sends and receives, sorted by (start, rank); a rank's
    equal starts stay in program order (empty for a compute schedule). ``blocked_at``: when
    the rank began to wait at a node that waited for its message."""
    structure = step.structure
    n_works, messages = structure.n_nodes, structure.messages
    rows = [
        (starts[node], rank, position, node, blocked_at.get(node, starts[node]))
        for rank, program in enumerate(structure.programs)
        for position, node in enumerate(program)
        if node >= n_works
    ]
    rows.sort()
    records = []
    for start, rank, _, node, posted in rows:
        j = node - n_works
        comm, message = structure.comms[j], structure.comm_messages[j]
        peer, n_bytes = rank, 0
        if message >= 0:
            sent = messages[message]
            peer = sent.dst_rank if comm.op.is_send else sent.src_rank
            n_bytes = step.message_bytes[message]
        records.append(
            CommRecord(
                rank=rank,
                comm=comm,
                peer=peer,
                n_bytes=n_bytes,
                posted=posted,
                start=start,
                end=ends[node],
            )
        )
    return tuple(records)


def memory_records(
    step: CompiledStep, starts: Sequence[Time], ends: Sequence[Time]
) -> tuple[MemoryRecord, ...]:
    """Each rank's memory after every change (:func:`pipesim.step.memory.held_levels`), at the
    start or end of the work that made it; sorted by (time, rank)."""
    rows: list[tuple[Time, int, int, int]] = []
    effects = step.effects
    for rank, order in enumerate(step.structure.orders):
        held, inflight = held_levels(effects, order)
        for i, node in enumerate(order):
            start_bytes, start_count, end_bytes, end_count = effects[node]
            if start_bytes or start_count:
                rows.append((starts[node], rank, held[2 * i], inflight[2 * i]))
            if end_bytes or end_count:
                rows.append((ends[node], rank, held[2 * i + 1], inflight[2 * i + 1]))
    rows.sort(key=_BY_TIME_THEN_RANK)
    return tuple(
        [
            MemoryRecord(rank=rank, time=time, activation_bytes=n_bytes, inflight=count)
            for time, rank, n_bytes, count in rows
        ]
    )


def _transfer_records(
    step: CompiledStep, ends: Sequence[Time], link_start: dict[int, Time], link_end: dict[int, Time]
) -> tuple[TransferRecord, ...]:
    """Every message, sorted by (link start, source rank, destination rank), then id; a
    message on a free link leaves and arrives when its producer ends."""
    structure = step.structure
    ranks, producers, consumers = structure.ranks, structure.producers, structure.consumers
    senders = _senders(structure) if structure.explicit_comms else producers
    rows = []
    for message, (source, node) in enumerate(zip(producers, consumers, strict=True)):
        if message in link_end:
            start, end = link_start[message], link_end[message]
        else:  # a free link: it arrives as it leaves
            start = end = ends[senders[message]] - step.leads.get(message, 0)
        rows.append((start, ranks[source], ranks[node], message, end))
    rows.sort(key=_BY_START_SOURCE_DESTINATION)
    sizes, messages = step.message_bytes, structure.messages
    records = []
    for start, src, dst, message, end in rows:
        producer, consumer = messages[message][:2]
        records.append(
            TransferRecord(
                src_rank=src,
                dst_rank=dst,
                producer=producer,
                consumer=consumer,
                n_bytes=sizes[message],
                start=start,
                end=end,
            )
        )
    return tuple(records)


_BY_START_SOURCE_DESTINATION = itemgetter(0, 1, 2)
