"""The overheads from the gaps between units of work: rules 2-5 of
:mod:`pipesim.calibration` (dispatch, send, receive, latency; and for rendezvous sends
the handshake and posting a receive)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from operator import attrgetter
from typing import NamedTuple

from pipesim.calibration.measured import MeasuredStep
from pipesim.calibration.statistics import Sample, _whole, median, robust
from pipesim.calibration.transitions import _Post, _Source, _Transition, _transitions
from pipesim.costs import Link
from pipesim.engine import answers_at_node_end
from pipesim.exact import Time


def _fit_overheads(
    steps: Sequence[MeasuredStep], send_mode: str
) -> tuple[Link, Time, dict[str, list[Sample]], dict[tuple[int, int], Link]]:
    """Dispatch, send, receive and latency (and the handshake of rendezvous sends) from
    the gaps between units of work; the same per ordered rank pair (direction) where its
    messages can be told apart."""
    found = _transitions(steps)
    # The rendezvous model charges posting receives (Link.post_overhead): the dispatch
    # comes from transitions without one; the eager model leaves it in the dispatch.
    posting = send_mode != "eager"
    idle = [
        (t.step, t.gap)
        for t in found
        if t.taken_b == 0 and t.sent_a == 0 and not (posting and t.posts_a)
    ]
    dispatch = robust(idle) if idle else 0
    fit = _message_costs if send_mode == "eager" else _rendezvous_costs
    link, samples = fit(found, dispatch)
    pairs = sorted({p for t in found for p in t.sent_pairs | t.taken_pairs | t.posted_pairs})
    by_pair = {}
    for pair in pairs:
        only = [
            t
            for t in found
            if t.sent_pairs <= {pair} and t.taken_pairs <= {pair} and t.posted_pairs <= {pair}
        ]
        by_pair[pair], _ = fit(only, dispatch, fallback=link)
    return link, _whole(dispatch), {"dispatch": idle, **samples}, by_pair


def _had_arrived(last: Time, t: _Transition, bound: Time | None, send: Time) -> bool:
    """Whether the last message ``b`` takes had surely arrived when the rank became free:
    by the latency bound when there is one, else sent before ``a`` even started."""
    if bound is None:
        return last <= t.start_a
    return last + bound <= t.end_a + send * t.sent_a


def _message_costs(
    found: Sequence[_Transition], dispatch: Time, *, fallback: Link | None = None
) -> tuple[Link, dict[str, list[Sample]]]:
    """Rules 2-4 of the module docstring over ``found``; a figure without samples is
    ``fallback``'s (0 without one)."""
    base = fallback or Link()
    local = [t for t in found if t.taken_b == 0 and t.sent_a]
    posting: list[Sample] = [(t.step, Fraction(t.gap - dispatch, t.sent_a)) for t in local]
    send = robust(posting) if posting else base.send_overhead

    def departure(source: _Source) -> Time:
        return source.end + send * source.sent

    taken = [t for t in found if t.taken_b]
    # Waited: the rank was free before the message even left, so b's compute starts
    # latency + receive * taken after the last departure (plus the dispatch).
    waited = [
        (t, t.start_b - dispatch - last)
        for t in taken
        if (last := max(departure(s) for s in t.sources)) > t.end_a + send * t.sent_a
    ]
    # Each waited value is latency + receive * taken >= latency: a bound on the latency
    # that tells which messages had arrived when the rank became free.
    bound = median([v for _, v in waited]) if waited else None
    arrived: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch - send * t.sent_a, t.taken_b))
        for t in taken
        if _had_arrived(max(departure(s) for s in t.sources), t, bound, send)
    ]
    receive = robust(arrived) if arrived else base.receive_overhead
    values = [(t.step, v - receive * t.taken_b) for t, v in waited]
    latency = robust(values) if values else base.latency
    link = Link(
        latency=_whole(latency), send_overhead=_whole(send), receive_overhead=_whole(receive)
    )
    return link, {"send_overhead": posting, "receive_overhead": arrived, "latency": values}


@dataclass(frozen=True, slots=True)
class _Rendezvous:
    """The rendezvous overheads fitted before the receive overhead (rules 2 and 2b), and
    the times they put on a transition."""

    dispatch: Time
    send: Time
    """Per message sent."""
    post: Time
    """Per receive posted."""
    base: Link
    """Where a figure without samples comes from."""

    def sent(self, source: _Source) -> Time:
        """When a message is sent: its producer's end and its send overheads."""
        return source.end + self.send * source.sent

    def posted(self, post: _Post) -> Time:
        """When a receive is posted: after its node, that node's sends and the receives
        posted there before it."""
        return post.end + self.send * post.sent + self.post * post.ahead

    def free(self, t: _Transition) -> Time:
        """When ``a``'s rank is done with ``a``'s sends and the receives it posts."""
        return t.end_a + self.send * t.sent_a + self.post * t.posts_a


class _Departure(NamedTuple):
    """When the last message a unit of work takes could leave (no handshake counted)."""

    at: Time
    node_end: Time | None
    """When its receive came second while its sender was inside a node or waking up for
    one: that node's end (it answers then, or a handshake after the receive); else None."""


class _Waited(NamedTuple):
    """A transition whose ``b`` waited for its last message."""

    transition: _Transition
    value: Time
    """``b``'s compute start less the dispatch less the departure: latency (+ the
    sender's answer) + receive overhead * messages taken."""
    node_end: Time | None
    """As :attr:`_Departure.node_end`."""


def _rendezvous_costs(
    found: Sequence[_Transition], dispatch: Time, *, fallback: Link | None = None
) -> tuple[Link, dict[str, list[Sample]]]:
    """Rules 2-4 and 5 of the module docstring (rendezvous sends), over ``found``."""
    base = fallback or Link()
    # 2b: posting receives, from the gaps where nothing else happens but the dispatch.
    posted: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch, t.posts_a))
        for t in found
        if t.taken_b == 0 and t.sent_a == 0 and t.posts_a and not t.late_posts_a
    ]
    post = robust(posted) if posted else base.post_overhead
    local = [t for t in found if t.taken_b == 0 and t.sent_a and not t.late_posts_a]
    posting: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch - post * t.posts_a, t.sent_a)) for t in local
    ]
    send = robust(posting) if posting else base.send_overhead
    fitted = _Rendezvous(dispatch=dispatch, send=send, post=post, base=base)
    # Whether the sender was inside a node depends on the receive overhead at its start:
    # fit once without it, then again with the receive overhead found.
    receive, _, _ = _fit_rendezvous(found, fitted, receive=0)
    _, link, samples = _fit_rendezvous(found, fitted, receive=receive)
    return link, {"send_overhead": posting, "post_overhead": posted, **samples}


def _departure(t: _Transition, fitted: _Rendezvous, receive: Time) -> _Departure:
    """When the last message ``b`` takes could leave, by the engine's rule: once sent and
    its receive posted; a receive posted second is answered at the end of the sender's
    node when :func:`pipesim.engine.answers_at_node_end` says so."""
    departures: list[_Departure] = []
    for source, post, spans in zip(t.sources, t.posts, t.senders, strict=True):
        sent = fitted.sent(source)
        posted = sent if post is None else fitted.posted(post)
        if post is None or posted <= sent:
            departures.append(_Departure(sent, None))
            continue
        node_end = None
        for span in spans:
            begins = span.start - fitted.dispatch - receive * span.taken
            done = span.end + fitted.send * span.sent
            if answers_at_node_end(posted, begins, done, woken=post.node in span.takes_from):
                node_end = done
                break
            if begins >= posted:
                break
        departures.append(_Departure(posted, node_end))
    return max(departures, key=attrgetter("at"))


def _fit_rendezvous(
    found: Sequence[_Transition], fitted: _Rendezvous, *, receive: Time
) -> tuple[Time, Link, dict[str, list[Sample]]]:
    """Rules 3-5 given the overheads of rule 2 and a receive overhead for telling whether
    a sender was inside a node: the receive overhead, latency and handshake found."""
    dispatch, send, post, base = fitted.dispatch, fitted.send, fitted.post, fitted.base
    taken = [(t, _departure(t, fitted, receive)) for t in found if t.taken_b]
    # A late receive posted right before the work that needs it (after ``a``'s sends)
    # is waited for too: the handshake follows it.
    waited = [
        _Waited(t, t.start_b - dispatch - left.at, left.node_end)
        for t, left in taken
        if left.at > fitted.free(t)
        or (left.node_end is not None and left.at >= t.end_a + send * t.sent_a)
    ]
    # As rule 3: latency (+ the sender's answer) + receive * taken, per kind (True: left
    # at once), bound which messages had arrived when the rank became free.
    bounds = {
        kind: median(values)
        if (values := [w.value for w in waited if (w.node_end is None) is kind])
        else None
        for kind in (True, False)
    }

    def had_arrived(t: _Transition, left: _Departure) -> bool:
        bound = bounds[left.node_end is None]
        if bound is None:
            return left.at <= t.start_a
        return left.at + bound <= fitted.free(t)

    arrived: list[Sample] = [
        (t.step, Fraction(t.gap - dispatch - send * t.sent_a - post * t.posts_a, t.taken_b))
        for t, left in taken
        if had_arrived(t, left)
    ]
    new_receive = robust(arrived) if arrived else base.receive_overhead
    early = [
        (w.transition.step, w.value - new_receive * w.transition.taken_b)
        for w in waited
        if w.node_end is None
    ]
    # A median of all, unlike the overheads: a step has few such messages (one or two
    # per run of the 2-stage calibration), and whole process pairs deliver one late.
    latency = median([v for _, v in early]) if early else base.latency
    limited = _handshakes(waited, fitted, receive=new_receive, latency=latency)
    handshake = robust(limited) if limited else base.handshake
    link = Link(
        latency=_whole(latency),
        send_overhead=_whole(send),
        receive_overhead=_whole(new_receive),
        handshake=_whole(handshake),
        post_overhead=_whole(post),
    )
    return new_receive, link, {"receive_overhead": arrived, "latency": early, "handshake": limited}


def _handshakes(
    waited: Sequence[_Waited], fitted: _Rendezvous, *, receive: Time, latency: Time
) -> list[Sample]:
    """The handshake samples: per waited message answered by a computing sender, how long
    after its receive it left, where that came before the sender's node ended (the
    handshake, not the node's end, released it)."""
    samples: list[Sample] = []
    for w in waited:
        if w.node_end is None:
            continue
        t = w.transition
        answer = w.value - receive * t.taken_b - latency
        # The departure was b's compute start less the dispatch less the value.
        until_node_end = w.node_end - (t.start_b - fitted.dispatch - w.value)
        if answer < until_node_end:
            samples.append((t.step, answer))
    return samples
