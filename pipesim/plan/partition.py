"""The planner's layer -> stage cut: :mod:`pipesim.partition`, the one partitioner
that ``pipesim verify`` also cuts its torch model with, so the cut ``pipesim plan``
recommends is the cut verify runs.

The layers are the embedding, the blocks and the head (see
:func:`pipesim.plan.layers.model_layers`), each costed by its forward + backward
work; the embedding thus lands on the first stage and the head on the last.

>>> partition([0, 4, 4, 4, 4, 4, 4, 6], n_stages=3)
(3, 3, 2)
"""

from __future__ import annotations

from pipesim.partition import partition, stage_sums

__all__ = ["partition", "stage_sums"]
