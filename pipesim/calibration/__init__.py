"""Measured steps -> a cost model: per stage and op, plus the overheads that block a rank.

An executor (``pipesim verify``) times the *compute* of each unit of work, not
the waits, sends and receives around it. In pipesim's model
(:mod:`pipesim.costs`) a unit of work holds its rank for ``dispatch + receive
overheads + compute + send overheads``, and its messages arrive ``latency``
after its sends are posted. :func:`fit_costs` inverts that from one or more
measured steps (any schedules on one cut of the model, any micro-batch counts):

1. **compute**: per (stage, op) the median over every micro-batch of every
   step; an op never run falls back (B = I + W when only split backwards ran,
   I = W = B / 2 when only full ones), and the fit says so in ``assumed``;
2. **dispatch d and send overhead s**: from each rank's consecutive units
   ``a -> b`` where ``b`` takes no cross-rank message, the gap between ``a``'s
   compute end and ``b``'s compute start is ``s * (messages a sends) + d``;
3. **latency L**: where a message ``b`` takes was sent after ``a``'s node ended
   (so the rank waited for it), ``b``'s compute starts at
   ``last send + L + d + r * taken``; the median of those ``L + r * taken``
   bounds L from above;
4. **receive overhead r**: where every message ``b`` takes had arrived when the
   rank became free (sent early enough by that bound; without one, sent before
   ``a`` started), the gap is ``s * sent + d + r * taken``; then L follows from 3.

5. **rendezvous sends** (``send_mode="rendezvous"``, :mod:`pipesim.engine`): a message
   leaves when its receive is posted too (after the node the receiving rank runs
   before the RECV, :func:`pipesim.comms.receive_posts`) and, if that came second while
   the sender was inside a node (or waking up for the node that takes a message of the
   node the receive was posted after), answered; rules 3-4 use that departure (the sender's
   answer left out), the latency comes from the messages that left at once, and the
   **handshake** ``h`` from those waited for (a receive posted right before the work
   that needs it counts) that arrived before the sender's node ended: there ``b``'s
   compute starts ``h + L + d + r * taken`` after the receive was posted. Whether the
   sender was inside a node uses the receive overhead, so the fit runs twice. This model
   also charges **posting a receive** (``Link.post_overhead`` ``p``, paid after the sends
   of the node the lowering puts the RECV after): the dispatch comes from gaps with no
   receive posted, ``p`` from gaps with only receives posted, and the gaps of rules 2-4
   pay ``p`` per receive posted in them. A receive posted after its message was sent can
   stall its rank for milliseconds (gloo; 3.3-4.1 ms at one such post of the 6x256
   interleaved calibration in each of three runs), which no overhead of the rank's own
   describes: rules 2 (dispatch, post, send) leave such gaps out.

Compute times are medians over every micro-batch, which keeps a noisy
neighbour's stalls out. The overheads 2-5 are *medians of means* (:func:`robust`: the
mean of each measured step's samples, then the median over the steps; with fewer than
three steps, over three blocks of the samples): a step's makespan adds every overhead
up and their distribution has a tail that repeats from step to step (on gloo a message
the receiver had not posted for yet is often delivered only when the sender next
enters the library), which each step's mean keeps and a median of all samples would
leave out (replaying measured steps with their own compute times, median-fitted
overheads came out 3.0% short on average, mean-fitted 0.7%); while one slow step, or
one late message among a step's few, moves the median over the steps no further than
the next step's mean (a plain mean of the five samples of one calibration once put the
receive overhead at 2.46 ms per message, most of them well under one, and every
predicted step 15-33% long: docs/fidelity.md). The latency bound of rule 3 only sorts
transitions and stays a median of all, and so does the latency of rendezvous sends
(rule 5): it rests on a message or two per step, and in some process pairs gloo
delivers one of them only after the sender's step has ended. How far each figure can
be trusted is :attr:`CalibrationFit.terms`: its sample count, the spread of its
samples, and how far leaving out any one measured step moves it
(:func:`term_stability`). Times keep the trace's unit (verify: ns) and
are rounded to whole units. :func:`compute_only` is the converse: what an
executor would measure of a simulated step, so predictions and measurements
are compared on the same span (:func:`measured_makespan`, :func:`predict`).

The modules: :mod:`~pipesim.calibration.fit` (:func:`fit_costs`, rule 1, the assembly
and the stability of each figure), :mod:`~pipesim.calibration.overheads` (rules 2-5),
:mod:`~pipesim.calibration.transitions` (the measured gaps the rules read),
:mod:`~pipesim.calibration.statistics` (medians, means, :func:`robust`),
:mod:`~pipesim.calibration.measured` (the calibration schedule, a simulated step as an
executor measures it) and :mod:`~pipesim.calibration.prediction` (predictions spanned as
an executor measures them). Every public name imports from :mod:`pipesim.calibration`.

>>> from pipesim.costs import CostModel, Link
>>> from pipesim.engine import answers_at_node_end, run_compiled, simulate
>>> from pipesim.schedules import generate
>>> truth = CostModel.uniform(forward=40, backward=90, input_grad=50, weight_grad=45,
...                           link=Link(latency=3, send_overhead=2, receive_overhead=4),
...                           dispatch_overhead=1)
>>> steps = []
>>> for name in ("1f1b", "zb-h1"):
...     schedule = generate(name, n_ranks=2, n_microbatches=4)
...     trace = compute_only(simulate(schedule, costs=truth).trace, schedule, truth)
...     steps.append(MeasuredStep(schedule=schedule, trace=trace))
>>> fit = fit_costs(steps)
>>> fit.costs.stage(1).weight_grad, fit.costs.link.receive_overhead, fit.costs.dispatch_overhead
(45, 4, 1)
"""

from __future__ import annotations

from pipesim.calibration.fit import (
    STATISTIC,
    CalibrationFit,
    fit_costs,
    fit_meta,
    term_stability,
    unstable_terms,
)
from pipesim.calibration.measured import (
    MeasuredStep,
    calibration_schedule,
    compute_only,
    measured_makespan,
)
from pipesim.calibration.prediction import (
    compute_span,
    costs_for,
    cut_stages,
    predict,
    replay,
)
from pipesim.calibration.statistics import (
    BLOCKS,
    Sample,
    TermStats,
    mean,
    median,
    median_of_means,
    robust,
)

__all__ = [
    "BLOCKS",
    "STATISTIC",
    "CalibrationFit",
    "MeasuredStep",
    "Sample",
    "TermStats",
    "calibration_schedule",
    "compute_only",
    "compute_span",
    "costs_for",
    "cut_stages",
    "fit_costs",
    "fit_meta",
    "mean",
    "measured_makespan",
    "median",
    "median_of_means",
    "predict",
    "replay",
    "robust",
    "term_stability",
    "unstable_terms",
]
