"""How a job's steps are timed: warmup until the step time is steady, then the measured window.

Two ways to time the window (``timing``):

- ``sync``: the host clock around each step, which ends with ``loss.item()`` and a device
  synchronisation. Every step is timed on its own, but the host cannot queue step N+1 while the
  GPU still runs step N, which on a launch-bound GPU config changes what is being measured.
- ``events``: a CUDA event recorded on the stream at every step boundary and one
  synchronisation after the window; the host keeps queueing ahead as in real training, and the
  per-step times are the GPU-side intervals between boundaries. Losses are read after the window.

In both, ``window_ms`` is the host wall time from the window's start to its end (after the final
synchronisation), and tokens/s is taken over it (see perfsweep.metrics.summarize).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from math import inf
from typing import Protocol

import torch

from perfsweep.metrics import StepRecord, steady


class Steppable(Protocol):
    """The train loop's view of a trainer (perfsweep.runner.Trainer)."""

    device: torch.device

    def run(self) -> tuple[torch.Tensor, float]:
        """Queue one optimizer step; (loss tensor, data wait ms). Does not wait for the device."""
        ...

    def step(self) -> tuple[float, float, float]:
        """One step timed by the host clock, device synchronised: (ms, data wait ms, loss)."""
        ...


OnStep = Callable[[StepRecord], None]


def resolve_timing(timing: str, device: torch.device) -> str:
    """``auto`` is events on CUDA and sync elsewhere (events need a CUDA stream)."""
    if timing == "auto":
        return "events" if device.type == "cuda" else "sync"
    return timing


@dataclass
class Warmup:
    """Where measurement began and whether the step time had settled by then."""

    steps: int
    steady_state: bool | None
    """None when the check is off (``steps.stable_window=0``)."""


def warm_up(
    trainer: Steppable,
    records: list[StepRecord],
    minimum: int,
    window: int,
    tolerance: float,
    cap: int,
    on_step: OnStep,
    budget_s: float | None = None,
    agree: Callable[[bool], bool] = bool,
) -> Warmup:
    """Run at least ``minimum`` warmup steps, then more until :func:`perfsweep.metrics.steady`
    says the last two windows of ``window`` steps agree within ``tolerance``, at most ``cap``
    steps, and no further step once those past the minimum add up to ``budget_s`` (slow configs,
    e.g. bf16 on a CPU without bf16 units, would otherwise warm up for minutes; the minimum,
    which holds a compile, does not count). ``agree`` turns this process's "warm" into the job's:
    the ranks of a data-parallel job end warmup on the same step (perfsweep.distributed.all_agree)."""
    times: list[float] = []

    def one() -> None:
        ms, wait_ms, loss = trainer.step()
        times.append(ms)
        rec = StepRecord(len(records), "warmup", ms, wait_ms, loss)
        records.append(rec)
        on_step(rec)

    for _ in range(minimum):
        one()
    if window == 0:
        return Warmup(len(times), None)

    def warm() -> bool:
        done = steady(times, window, tolerance) or len(times) >= cap
        return agree(done or sum(times[minimum:]) >= 1000 * (budget_s or inf))

    while not warm():
        one()
    return Warmup(len(times), steady(times, window, tolerance))


def measure(trainer: Steppable, records: list[StepRecord], n: int, mode: str, on_step: OnStep) -> float:
    """Run the ``n`` measured steps, append their records, return the window's wall time in ms."""
    if mode == "events":
        return _measure_events(trainer, records, n, on_step)
    t0 = time.perf_counter()
    for _ in range(n):
        ms, wait_ms, loss = trainer.step()
        rec = StepRecord(len(records), "measure", ms, wait_ms, loss)
        records.append(rec)
        on_step(rec)
    return (time.perf_counter() - t0) * 1000.0


def _measure_events(trainer: Steppable, records: list[StepRecord], n: int, on_step: OnStep) -> float:
    dev = trainer.device
    if dev.type != "cuda":
        raise ValueError(f"timing=events needs a CUDA device, not {dev}")
    stream = torch.cuda.current_stream(dev)
    bounds = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    losses: list[torch.Tensor] = []
    waits: list[float] = []
    torch.cuda.synchronize(dev)  # the window starts with an idle device, as in sync mode
    t0 = time.perf_counter()
    bounds[0].record(stream)
    for i in range(n):
        loss, wait_ms = trainer.run()
        bounds[i + 1].record(stream)
        losses.append(loss.detach())
        waits.append(wait_ms)
    torch.cuda.synchronize(dev)
    window_ms = (time.perf_counter() - t0) * 1000.0
    for i in range(n):
        rec = StepRecord(len(records), "measure", bounds[i].elapsed_time(bounds[i + 1]), waits[i], losses[i].item())
        records.append(rec)
        on_step(rec)
    return window_ms
