"""Which job runs when: the grid points of a sweep, repeated in rounds (``repeat``, ``order``).

Repeats run in rounds, all grid points once and then again, so slow drift of the machine
(thermal state, a neighbour's load) spreads over every config instead of landing on one. With
``order=shuffle`` each round visits the grid points in a new order drawn from the sweep's seed,
and a round never starts with the config the previous one ended on, so no config runs twice in a
row. The plan is a pure function of its inputs, which is what lets ``resume`` find the jobs that
are missing by their position.
"""

from __future__ import annotations

import random


def plan(n_points: int, repeat: int, shuffle: bool, seed: int) -> list[tuple[int, int]]:
    """(grid point index, repeat index) of every job, in launch order."""
    if n_points < 1 or repeat < 1:
        raise ValueError(f"a plan needs grid points and repeats, got {n_points} and {repeat}")
    rng = random.Random(seed)
    out: list[tuple[int, int]] = []
    for r in range(repeat):
        order = list(range(n_points))
        if shuffle:
            rng.shuffle(order)
            if out and n_points > 1 and order[0] == out[-1][0]:
                order[0], order[1] = order[1], order[0]
        out.extend((i, r) for i in order)
    return out
