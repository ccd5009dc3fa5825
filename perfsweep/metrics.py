"""Summary statistics of a job's measured steps: the one place where figures are aggregated."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from perfsweep.names import BOTTLENECK_RULE, DATA_BOUND_WAIT_FRACTION, GPU_BOUND_BUSY_FRACTION


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class StepRecord:
    """One optimizer step as the train loop saw it."""

    step: int
    phase: str  # "warmup" or "measure"
    step_time_ms: float
    data_wait_ms: float
    loss: float


def summarize(records: Sequence[StepRecord], tokens_per_step: int, samples_per_step: int) -> dict[str, float | None]:
    """Figures for ``runs``, from measured steps only (warmup excluded).

    tokens/s is total tokens over total time of the measured steps, not the mean of per-step
    rates, so one slow step weighs as much as it cost. Every token is effective: the LM windows
    carry no padding.
    """
    measured = [r for r in records if r.phase == "measure"]
    if not measured:
        raise ValueError("no measured steps to summarize")
    times = [r.step_time_ms for r in measured]
    waits = [r.data_wait_ms for r in measured]
    total_s = sum(times) / 1000.0
    return {
        "first_step_ms": records[0].step_time_ms,
        "step_time_ms_median": statistics.median(times),
        "step_time_ms_p10": percentile(times, 10),
        "step_time_ms_p90": percentile(times, 90),
        "step_time_ms_mean": statistics.fmean(times),
        "step_time_ms_std": statistics.stdev(times) if len(times) > 1 else 0.0,
        "data_wait_ms_median": statistics.median(waits),
        "data_wait_fraction": sum(waits) / sum(times) if sum(times) > 0 else None,
        "tokens_per_s": tokens_per_step * len(measured) / total_s,
        "samples_per_s": samples_per_step * len(measured) / total_s,
        "final_loss": measured[-1].loss,
    }


def bottleneck_verdict(
    gpu_busy_ms: float | None, step_time_ms_median: float | None, data_wait_fraction: float | None
) -> dict[str, float | str | None]:
    """``gpu_busy_fraction`` and the ``bottleneck`` verdict of a run, by :data:`BOTTLENECK_RULE`.

    Busy time comes from the profiled steps, the step time from the measured (unprofiled) ones,
    so the profiler's own overhead does not dilute the fraction. Without a GPU busy time (CPU
    runs, profiling off) every field is None: a verdict is never guessed.
    """
    if gpu_busy_ms is None or not step_time_ms_median:
        return {"gpu_busy_ms": None, "gpu_busy_fraction": None, "bottleneck": None, "bottleneck_rule": None}
    busy = gpu_busy_ms / step_time_ms_median
    if data_wait_fraction is not None and data_wait_fraction > DATA_BOUND_WAIT_FRACTION:
        verdict = "data"
    elif busy >= GPU_BOUND_BUSY_FRACTION:
        verdict = "gpu"
    else:
        verdict = "host"
    return {
        "gpu_busy_ms": gpu_busy_ms,
        "gpu_busy_fraction": busy,
        "bottleneck": verdict,
        "bottleneck_rule": BOTTLENECK_RULE,
    }


def model_flops_utilisation(
    flops_per_token: float, tokens_per_s: float, peak_flops: float | None
) -> dict[str, float | None]:
    """``model_tflops_per_s`` (model FLOPs, not hardware FLOPs: recomputation is not counted)
    and ``mfu``, its share of the device's dense peak in the run's compute dtype (None off GPU)."""
    model_flops_per_s = flops_per_token * tokens_per_s
    return {
        "model_tflops_per_s": model_flops_per_s / 1e12,
        "mfu": model_flops_per_s / peak_flops if peak_flops else None,
        "mfu_peak_flops": peak_flops,
    }
