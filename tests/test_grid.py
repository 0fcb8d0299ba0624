"""The pipeline chapter's cycle table, and its 2-stage x 4-micro-batch example.

The chapter (pipeline parallelism, seeds/001) runs 4 micro-batches through 2 stages,
forward only. Sequential execution takes m * s = 8 cycles; fill-drain takes m + s - 1 = 5
cycles with 2 idle slots out of 10, efficiency m / (m + s - 1) = 0.80. Its table:

    siklus  tahap0  tahap1
         0     mb0       -
         1     mb1     mb0
         2     mb2     mb1
         3     mb3     mb2
         4       -     mb3
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from pipesim.costs import CostModel
from pipesim.engine import simulate
from pipesim.errors import PipesimError
from pipesim.grid import format_grid, grid_cells
from pipesim.schedules import generate

CHAPTER_TABLE = [["0", "-"], ["1", "0"], ["2", "1"], ["3", "2"], ["-", "3"]]


def test_chapter_fill_drain() -> None:
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True))
    assert grid_cells(sim) == CHAPTER_TABLE
    m = sim.metrics
    assert m.makespan == 5  # m + s - 1 cycles
    assert m.idle_slots == 2
    assert m.efficiency == Fraction(4, 5)
    assert f"{float(m.efficiency):.2f}" == "0.80"
    assert m.bubble_ratio == Fraction(1, 5)  # "bubble 20%"
    assert m.busy == 8  # 2 stages x 4 micro-batches
    assert format_grid(sim) == "\n".join(
        [
            "cycle  rank 0  rank 1",
            "    0       0       -",
            "    1       1       0",
            "    2       2       1",
            "    3       3       2",
            "    4       -       3",
        ]
    )


def test_chapter_sequential() -> None:
    sim = simulate(generate("sequential", n_ranks=2, n_microbatches=4, forward_only=True))
    assert sim.metrics.makespan == 8  # m * s: only one stage works at a time
    assert sim.metrics.efficiency == Fraction(1, 2)
    cells = grid_cells(sim)
    assert cells == [[str(c // 2), "-"] if c % 2 == 0 else ["-", str(c // 2)] for c in range(8)]
    assert all(row.count("-") == 1 for row in cells)


def test_unit_costs_of_the_cli_give_the_same_table() -> None:
    costs = CostModel.uniform(forward=1, backward=2)
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True), costs=costs)
    assert grid_cells(sim) == CHAPTER_TABLE


def test_training_labels_and_long_actions() -> None:
    # 1F1B, p=2, m=2, F=1, B=2: a backward fills two cycles.
    sim = simulate(generate("1f1b", n_ranks=2, n_microbatches=2))
    assert grid_cells(sim) == [
        ["F0", "-"],
        ["F1", "F0"],
        ["-", "B0"],
        ["-", "B0"],
        ["B0", "F1"],
        ["B0", "B1"],
        ["-", "B1"],
        ["B1", "-"],
        ["B1", "-"],
    ]


def test_interleaved_cells_name_the_stage() -> None:
    costs = CostModel.uniform(forward=1, backward=1)
    sim = simulate(
        generate("interleaved-1f1b", n_ranks=2, n_microbatches=2, virtual=2), costs=costs
    )
    cells = grid_cells(sim)
    assert cells[0] == ["0F0", "-"]
    assert cells[2] == ["2F0", "1F1"]
    assert sum(cell != "-" for row in cells for cell in row) == 16  # every action, 1 cycle each


def test_grid_needs_whole_cycles() -> None:
    costs = CostModel.uniform(forward=1, backward=Fraction(3, 2))
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=2), costs=costs)
    with pytest.raises(PipesimError, match="whole number of cycles of 1"):
        grid_cells(sim)


def test_grid_cycle_is_the_shortest_action() -> None:
    costs = CostModel.uniform(forward=2)
    sim = simulate(generate("gpipe", n_ranks=2, n_microbatches=4, forward_only=True), costs=costs)
    assert grid_cells(sim) == CHAPTER_TABLE
