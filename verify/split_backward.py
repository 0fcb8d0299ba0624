"""A stage's backward split in two: I (input gradient) now, W (weight gradients) later.

Zero-bubble schedules (Qi et al. 2024) run a stage's backward as I, which only
computes the gradient of the stage's input, and W, which computes its
parameters' gradients from what I left behind. W must not walk the activation
path again: it starts from the gradients that I saw arrive at the *boundary*
nodes of the autograd graph, the nodes on the path to the input that also feed
a parameter (a Linear's ``AddmmBackward0``, a LayerNorm's backward). This is the
approach of torch.distributed.pipelining (``_backward.py``:
``stage_backward_input`` saves the gradients flowing into those nodes with node
pre-hooks, ``stage_backward_weight`` starts ``autograd.grad`` at them); the
graph walk here is pipesim's own.

Why the bits are those of one whole backward: autograd computes every output of
a node with its own formula, from the node's incoming gradient and its saved
tensors; which outputs a pass asks for does not change how one is computed. I
runs every node on the path to the input with the same incoming gradients as
a whole backward would (all of a boundary node's producers are on that path,
so its incoming gradient is complete when the pre-hook sees it), and W runs the
same nodes on those same gradients for the outputs towards the parameters.
Boundary nodes whose weight-side subgraphs meet (a parameter used twice) are
one group, run by one ``autograd.grad`` so that their contributions meet in the
parameter's gradient buffer as in a whole backward, not in ``.grad``.

>>> import torch
>>> from torch import nn
>>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
>>> x = torch.randn(5, 3, requires_grad=True)
>>> loss = net(x).square().sum()
>>> params = list(net.parameters())
>>> gx, pending = input_backward(loss, None, x, params)
>>> [g.shape for g in weight_backward(pending)] == [p.shape for p in params]
True
>>> (len(pending.groups), pending.saved_bytes)  # one group per Linear; 4 * (5 * 2 + 5 * 4)
(2, 120)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["PendingWeights", "input_backward", "weight_backward"]

_TO_INPUT, _TO_PARAM = 1, 2  # what a node of the graph leads to


@dataclass(frozen=True, slots=True, kw_only=True)
class _Group:
    """Boundary nodes whose weight-side subgraphs meet, and the parameters below them."""

    nodes: tuple[Node, ...]
    grads: tuple[tuple[Tensor | None, ...], ...]  # per node, the gradients I saw arrive
    params: tuple[int, ...]  # indices into PendingWeights.params


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingWeights:
    """What I leaves for W: per group, the boundary nodes and their incoming gradients.

    Without an input path to start from (a copy's first stage, an input that does
    not require grad, an output that does not depend on its input) W is one whole
    backward from ``root`` with ``root_grad``, as torch's runtime does for stage 0.
    ``saved_bytes``: the distinct gradient tensors held between I and W.
    """

    params: tuple[Tensor, ...]
    groups: tuple[_Group, ...] = ()
    param_edges: tuple[GradientEdge, ...] = ()  # per parameter, its AccumulateGrad edge
    root: Tensor | None = None
    root_grad: Tensor | None = None
    saved_bytes: int = 0


def _leads_to(
    root: Node, x_node: Node, param_nodes: set[Node]
) -> tuple[dict[Node, int], dict[Node, list[Node]]]:
    """Per node reachable from ``root``: whether the input / a parameter is below it;
    and its children (``next_functions`` read once: each read builds a tuple)."""
    marks: dict[Node, int] = {}
    children: dict[Node, list[Node]] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:  # iterative post-order: a stage's graph can be deeper than Python's stack
        node, children_done = stack.pop()
        if children_done:
            mark = _TO_INPUT if node is x_node else _TO_PARAM if node in param_nodes else 0
            for child in children[node]:
                mark |= marks[child]
            marks[node] = mark
        elif node not in children:
            below = children[node] = [c for c, _ in node.next_functions if c is not None]
            stack.append((node, True))  # the graph is a DAG: its children finish first
            stack.extend((c, False) for c in below if c not in children)
    return marks, children


def _groups(
    marks: dict[Node, int], children: dict[Node, list[Node]], param_index: dict[Node, int]
) -> list[tuple[list[Node], set[int]]]:
    """Boundary nodes (on the input path, with a child that only leads to parameters),
    grouped by union-find where their weight-side subgraphs share a node."""
    owner: dict[Node, int] = {}  # weight-side node -> the group that reached it first
    parent: list[int] = []
    boundaries: list[Node] = []

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for node, mark in marks.items():
        if not mark & _TO_INPUT:
            continue
        below = [c for c in children[node] if marks[c] == _TO_PARAM]
        if not below:
            continue
        me = len(parent)
        parent.append(me)
        boundaries.append(node)
        while below:  # weight-side nodes have weight-side children only
            n = below.pop()
            if n in owner:
                parent[find(owner[n])] = find(me)
                continue
            owner[n] = me
            below.extend(children[n])
    grouped: dict[int, tuple[list[Node], set[int]]] = {}
    for i, node in enumerate(boundaries):
        grouped.setdefault(find(i), ([], set()))[0].append(node)
    for n, i in owner.items():
        if n in param_index:
            grouped[find(i)][1].add(param_index[n])
    return list(grouped.values())


def _distinct_bytes(grads: Sequence[tuple[Tensor | None, ...]]) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for g in (g for gs in grads for g in gs if g is not None):
        key = (g.untyped_storage().data_ptr(), int(g.storage_offset()))
        if key not in seen:
            seen.add(key)
            total += g.numel() * g.element_size()
    return total


def input_backward(
    root: Tensor, grad: Tensor | None, x: Tensor, params: Sequence[Tensor], /
) -> tuple[Tensor | None, PendingWeights]:
    """The gradient of ``x`` (None where ``root`` does not depend on it) from ``root``
    with incoming ``grad`` (None for a scalar loss), and what W needs for ``params``."""
    whole = PendingWeights(params=tuple(params), root=root, root_grad=grad)
    if not (root.requires_grad and x.requires_grad):
        return None, whole
    if root.grad_fn is None:  # the stage hands on a leaf (its input, say): nothing to split
        (gx,) = torch.autograd.grad(
            root, x, grad_outputs=grad, retain_graph=True, allow_unused=True
        )
        return gx, whole
    x_node = get_gradient_edge(x).node
    edges = tuple(get_gradient_edge(p) for p in params)  # each makes a view: once per I
    param_index = {e.node: i for i, e in enumerate(edges)}
    marks, children = _leads_to(root.grad_fn, x_node, set(param_index))
    if not marks[root.grad_fn] & _TO_INPUT:
        return None, whole
    grouped = _groups(marks, children, param_index)
    seen: dict[Node, tuple[Tensor | None, ...]] = {}

    def saver(node: Node) -> Callable[[tuple[Tensor | None, ...]], None]:
        def hook(grad_outputs: tuple[Tensor | None, ...]) -> None:
            seen[node] = grad_outputs

        return hook

    handles = [n.register_prehook(saver(n)) for nodes, _ in grouped for n in nodes]
    try:
        (gx,) = torch.autograd.grad(root, x, grad_outputs=grad, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    groups = tuple(
        _Group(nodes=tuple(nodes), grads=tuple(seen[n] for n in nodes), params=tuple(sorted(ps)))
        for nodes, ps in grouped
    )
    saved = _distinct_bytes([gs for g in groups for gs in g.grads])
    return gx, PendingWeights(
        params=tuple(params), groups=groups, param_edges=edges, saved_bytes=saved
    )


def _clamp(grads: tuple[Tensor | None, ...]) -> Callable[[object], tuple[Tensor | None, ...]]:
    def hook(_: object) -> tuple[Tensor | None, ...]:
        return grads

    return hook


def _group_grads(group: _Group, param_edges: Sequence[GradientEdge]) -> tuple[Tensor, ...]:
    edges = [
        (GradientEdge(n, i), g)
        for n, gs in zip(group.nodes, group.grads, strict=True)
        for i, g in enumerate(gs)
        if g is not None
    ]
    # One boundary node can lie above another on the input path; the walk from the
    # upper one would add its share into the lower one again, so every boundary node
    # is held to the gradient I saw (torch's _backward.py clamps the same way).
    pairs = zip(group.nodes, group.grads, strict=True)
    handles = [n.register_prehook(_clamp(gs)) for n, gs in pairs] if len(group.nodes) > 1 else []
    try:
        return torch.autograd.grad(
            [e for e, _ in edges],
            [param_edges[i] for i in group.params],
            grad_outputs=[g for _, g in edges],
            retain_graph=True,  # another group's walk may still pass a node of this one
        )
    finally:
        for h in handles:
            h.remove()


def weight_backward(pending: PendingWeights, /) -> list[Tensor | None]:
    """Per parameter, its gradient from the work I left (None where it gets none)."""
    params = pending.params
    if pending.root is not None:
        if not (pending.root.requires_grad and params):
            return [None] * len(params)
        return list(
            torch.autograd.grad(
                pending.root, params, grad_outputs=pending.root_grad, allow_unused=True
            )
        )
    out: list[Tensor | None] = [None] * len(params)
    for group in pending.groups:
        if group.params:
            for i, g in zip(group.params, _group_grads(group, pending.param_edges), strict=True):
                out[i] = g
    return out
