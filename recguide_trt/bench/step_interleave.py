"""Policies measured step by step in turns: the sweep's ``--interleave step``.

A shared host's speed drifts by 10 % and more over minutes, so cells run one after another (``cell``) compare
policies measured at different speeds. Here each policy runs its closed-loop cell on an engine of its own (the
same model and settings; its own KV cache, policy state and cost refit), and one driver steps the engines in
turns, always the one whose own clock is furthest behind. Each engine reads a :class:`StepClock`, which runs only
during that engine's steps, so every figure of a cell (its throughput window, every request's timestamps) is in
the seconds its own steps took, and the engines' steps are spread evenly over the same minutes of the host: drift
falls on every policy alike, at every concurrency, at the grain of one step.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from .loop import Cell, CellResult


class StepClock:
    """Seconds that pass only while :meth:`running`: the time of one engine's own steps."""

    def __init__(self) -> None:
        self._elapsed = 0.0
        self._since: float | None = None

    def __call__(self) -> float:
        if self._since is None:
            return self._elapsed
        return self._elapsed + (time.perf_counter() - self._since)

    @contextmanager
    def running(self):
        if self._since is not None:
            raise RuntimeError("the clock is already running")
        self._since = time.perf_counter()
        try:
            yield
        finally:
            self._elapsed += time.perf_counter() - self._since
            self._since = None


def run_interleaved(cells: list[Cell], clocks: list[StepClock]) -> list[CellResult]:
    """Step ``cells`` to their ends in turns and return their figures, in order.

    ``clocks[i]`` is the clock of ``cells[i]``'s engine (which no other cell may share). Each turn steps the cell
    whose clock reads least (the lowest index on a tie), so the engines' clocks stay within one step of each other
    while their cells run; a cell that is done drops out and the rest go on."""
    if len(cells) != len(clocks):
        raise ValueError(f"{len(cells)} cells but {len(clocks)} clocks")
    if len({id(c) for c in clocks}) != len(clocks):
        raise ValueError("each cell needs a clock of its own")
    while True:
        live = [i for i, c in enumerate(cells) if not c.done]
        if not live:
            break
        i = min(live, key=lambda j: clocks[j]())
        with clocks[i].running():
            cells[i].advance()
    results = []
    for cell, clock in zip(cells, clocks):
        with clock.running():
            results.append(cell.finish())
    return results
