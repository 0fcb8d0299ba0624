"""verify.split_backward: I then W gives the bits of one whole backward, without W
walking the input path again.

Oracle: ``torch.autograd.backward`` of the same graph (a fresh copy of the module on
the same input), the plain way; byte counts worked by hand.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402

from verify.blocks import Block  # noqa: E402
from verify.split_backward import input_backward, weight_backward  # noqa: E402

pytestmark = pytest.mark.torch


class Twice(nn.Module):
    """One Linear used twice on the input path: its two uses form one group, one above
    the other (the case torch's _backward.py clamps)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.lin(torch.tanh(self.lin(x)))
        return out


class Offset(nn.Module):
    """A parameter added straight to the activation, and one that scales it."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.randn(6))
        self.scale = nn.Parameter(torch.randn(6))

    def forward(self, x: Tensor) -> Tensor:
        return (x + self.shift) * self.scale + self.shift


class Ignores(nn.Module):
    """Output independent of the input: the input gradient is none, W is whole."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(6))

    def forward(self, x: Tensor) -> Tensor:
        return self.bias.expand(x.shape[0], 6) * 2


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 6))


# name: (module, input shape, boundary nodes per group (sorted), worked by hand; None: not)
MODULES: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...], list[int] | None]] = {
    "mlp": (_mlp, (5, 6), [1, 1, 1]),  # one per Linear
    "twice": (Twice, (5, 6), [2]),  # both uses of the Linear
    "offset": (Offset, (5, 6), [1, 2]),  # the scale's multiply; both adds of the shift
    "ignores": (Ignores, (5, 6), []),
    "gpt-block": (lambda: Block(width=16, n_heads=2, seq_len=4), (3, 4, 16), None),
}


def _whole(module: nn.Module, x: Tensor, grad: Tensor) -> tuple[Tensor | None, list[Tensor]]:
    x = x.detach().requires_grad_(True)
    module(x).backward(grad)
    return x.grad, [p.grad for p in module.parameters()]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_input_then_weight_is_one_whole_backward(name: str) -> None:
    build, shape, group_sizes = MODULES[name]
    torch.manual_seed(3)
    module = build()
    reference = copy.deepcopy(module)
    x, grad = torch.randn(shape), torch.randn(shape)
    expected_gx, expected = _whole(reference, x, grad)
    leaf = x.detach().requires_grad_(True)
    params = list(module.parameters())
    gx, pending = input_backward(module(leaf), grad, leaf, params)
    assert all(p.grad is None for p in params)  # I leaves the weights alone
    if group_sizes is not None:
        assert sorted(len(g.nodes) for g in pending.groups) == group_sizes
    if expected_gx is None or name == "ignores":
        assert gx is None and pending.root is not None
    else:
        assert torch.equal(gx, expected_gx)
        assert pending.root is None  # split at the boundary nodes, not a whole backward
    got = weight_backward(pending)
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def test_weight_pass_does_not_walk_the_input_path_again() -> None:
    """The ReLU and GELU only lie on the input path: I runs them, W must not."""
    module = _mlp()
    x = torch.randn(5, 6, requires_grad=True)
    out = module(x)
    gelu = out.grad_fn.next_functions[1][0]  # AddmmBackward0 -> (bias, input, weight.t())
    relu = gelu.next_functions[0][0].next_functions[1][0]
    assert type(gelu).__name__ == "GeluBackward0" and type(relu).__name__ == "ReluBackward0"
    runs = {"gelu": 0, "relu": 0}
    for key, node in (("gelu", gelu), ("relu", relu)):
        node.register_prehook(lambda _, key=key: runs.__setitem__(key, runs[key] + 1))
    _, pending = input_backward(out, torch.randn(5, 6), x, list(module.parameters()))
    assert runs == {"gelu": 1, "relu": 1}
    weight_backward(pending)
    assert runs == {"gelu": 1, "relu": 1}
    assert len(pending.groups) == 3  # one per Linear


def test_saved_bytes_are_the_gradients_at_the_boundaries() -> None:
    """Three Linears: the gradients entering their backward, (5, 6) + (5, 8) + (5, 8)
    float32; the first Linear's input gradient is I's own result, not saved for W."""
    module = _mlp()
    x = torch.randn(5, 6, requires_grad=True)
    _, pending = input_backward(module(x), torch.randn(5, 6), x, list(module.parameters()))
    assert pending.saved_bytes == 4 * (5 * 6 + 5 * 8 + 5 * 8)


def test_a_stage_without_input_gradient_runs_w_whole() -> None:
    """A copy's first stage: its input needs no gradient; W is the whole backward."""
    module = _mlp()
    reference = copy.deepcopy(module)
    x, grad = torch.randn(5, 6), torch.randn(5, 6)
    reference(x).backward(grad)
    gx, pending = input_backward(module(x), grad, x, list(module.parameters()))
    assert gx is None and pending.root is not None and pending.saved_bytes == 0
    got = weight_backward(pending)
    assert all(torch.equal(g, p.grad) for g, p in zip(got, reference.parameters(), strict=True))
