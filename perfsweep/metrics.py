"""Summary statistics of a job's measured steps: the one place where figures are aggregated."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from perfsweep.names import (
    BOTTLENECK_RULE,
    DATA_BOUND_WAIT_FRACTION,
    GPU_BOUND_BUSY_FRACTION,
    NOISY_STEP_TIME_RATIO,
)


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


# --- figures derived from stored columns, for the summary, the report and the comparison -------
# They take pandas Series or numpy arrays (one value per run) so a report over 10,000 runs is
# one vectorised expression, and each rule lives here only.


def throughput_range(tokens_per_step: ArrayLike, step_time_ms_p10: ArrayLike, step_time_ms_p90: ArrayLike):
    """(``tokens_per_s_lo``, ``tokens_per_s_hi``): the throughput at the p90 and at the p10 step
    time, i.e. how steady the measured steps were (not a standard error)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return tokens_per_step * 1000.0 / step_time_ms_p90, tokens_per_step * 1000.0 / step_time_ms_p10


def noisy(step_time_ms_p10: ArrayLike, step_time_ms_p90: ArrayLike):
    """True where p90/p10 step time exceeds :data:`NOISY_STEP_TIME_RATIO`; False where unknown."""
    p10 = np.asarray(step_time_ms_p10, dtype=float)
    p90 = np.asarray(step_time_ms_p90, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        flag = np.nan_to_num(p90 / p10, nan=0.0, posinf=0.0) > NOISY_STEP_TIME_RATIO
    if isinstance(step_time_ms_p10, pd.Series):
        return pd.Series(flag, index=step_time_ms_p10.index)
    return flag if flag.ndim else bool(flag)


def speedup(tokens_per_s: ArrayLike, baseline_tokens_per_s: float | None):
    """tokens/s over the baseline's (NaN without a baseline)."""
    if not baseline_tokens_per_s:
        return tokens_per_s * np.nan
    return tokens_per_s / baseline_tokens_per_s


def change_pct(tokens_per_s_a: ArrayLike, tokens_per_s_b: ArrayLike):
    """A's tokens/s relative to B's, in percent (positive: A is faster)."""
    return (tokens_per_s_a / tokens_per_s_b - 1.0) * 100.0


def ranges_overlap(lo_a: ArrayLike, hi_a: ArrayLike, lo_b: ArrayLike, hi_b: ArrayLike):
    """True where the two throughput ranges overlap: the comparison's "within noise" rule."""
    return np.maximum(lo_a, lo_b) <= np.minimum(hi_a, hi_b)
