"""Every derived figure perfsweep stores or shows, computed here and nowhere else.

A job's steps become typed figure groups (:class:`StepFigures`, :class:`Verdict`,
:class:`Utilisation`) whose fields are ``runs`` columns of the same names, units in the names;
the runner fills them and the store writes ``.row()``. Figures derived from stored columns for
display (throughput range, noise flag, speedup, change between sweeps) are the vectorised
functions at the end, which the summary, the report and the comparison call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from perfsweep.names import (
    BOTTLENECK_RULE,
    DATA_BOUND_WAIT_FRACTION,
    GPU_BOUND_BUSY_FRACTION,
    NOISY_IQR_FRACTION,
    NOISY_RULE,
    NOISY_TAIL_FRACTION,
)


@dataclass
class StepRecord:
    """One optimizer step as the train loop saw it."""

    step: int
    phase: str  # "warmup", "measure", "memory" (CPU peak probe) or "profile"
    step_time_ms: float
    data_wait_ms: float
    loss: float


class Figures:
    """A group of derived figures, stored as ``runs`` columns of the same names."""

    def row(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class StepFigures(Figures):
    """What a run's measured steps say (warmup excluded); every field is a ``runs`` column."""

    first_step_ms: float
    step_time_ms_median: float
    step_time_ms_p10: float
    step_time_ms_p90: float
    step_time_ms_iqr: float
    """p75 - p25 of the measured step times."""
    step_time_ms_mean: float
    step_time_ms_std: float
    step_time_cv: float
    """Coefficient of variation: std / mean of the measured step times."""
    noisy: bool
    """:func:`noisy_steps`: the step times spread (IQR) or a few slow steps moved the mean by more
    than :data:`perfsweep.names.NOISY_RULE` allows; differences of that size between configs may be
    noise."""
    noisy_rule: str
    """:data:`perfsweep.names.NOISY_RULE`, the rule that judged ``noisy``."""
    measure_wall_ms: float
    """Host wall time of the measured window, from its first step's start to its last step's end
    (after the device finished), whatever the timing mode."""
    data_wait_ms_median: float
    data_wait_fraction: float | None
    """Share of the measured steps' time spent waiting for the next batch."""
    data_bound: bool | None
    """:func:`data_bound` of ``data_wait_fraction``."""
    tokens_per_s: float | None
    """None for a model whose unit is samples (``model.unit``)."""
    samples_per_s: float
    final_loss: float
    """Loss of the last measured step (a NaN is stored as NULL: perfsweep.store.Real)."""
    nonfinite_loss_steps: int
    """Measured steps whose loss was NaN or infinite: the training blew up, and whatever the step
    times say is not the speed of a training that works."""

    @property
    def compile_time_ms(self) -> float:
        """What the first step cost beyond a steady one: torch.compile's compile time, for a
        compiled model (the first step also pays for allocator warmup, a few ms)."""
        return max(0.0, self.first_step_ms - self.step_time_ms_median)


def summarize(
    records: Sequence[StepRecord], tokens_per_step: int | None, samples_per_step: int, measure_wall_ms: float
) -> StepFigures:
    """Figures for ``runs``, from measured steps only (warmup excluded).

    tokens/s is the measured steps' tokens over the window's wall time, not the mean of
    per-step rates, so one slow step weighs as much as it cost, and in ``timing=events`` mode
    time the host spent between steps counts too. Every token is effective: the LM windows carry
    no padding. Percentiles interpolate linearly (numpy's default).
    """
    measured = [r for r in records if r.phase == "measure"]
    if not measured:
        raise ValueError("no measured steps to summarize")
    if not measure_wall_ms > 0:
        raise ValueError(f"the measured window took {measure_wall_ms} ms; expected a positive time")
    times = np.array([r.step_time_ms for r in measured])
    waits = np.array([r.data_wait_ms for r in measured])
    p10, p25, p50, p75, p90 = np.percentile(times, [10, 25, 50, 75, 90])
    mean = float(times.mean())
    std = float(times.std(ddof=1)) if len(times) > 1 else 0.0
    window_s = measure_wall_ms / 1000.0
    return StepFigures(
        first_step_ms=records[0].step_time_ms,
        step_time_ms_median=float(p50),
        step_time_ms_p10=float(p10),
        step_time_ms_p90=float(p90),
        step_time_ms_iqr=float(p75 - p25),
        step_time_ms_mean=mean,
        step_time_ms_std=std,
        step_time_cv=std / mean if mean > 0 else 0.0,
        noisy=bool(noisy_steps(float(p75 - p25), float(p50), mean)),
        noisy_rule=NOISY_RULE,
        measure_wall_ms=measure_wall_ms,
        data_wait_ms_median=float(np.median(waits)),
        data_wait_fraction=(wait := float(waits.sum() / times.sum()) if times.sum() > 0 else None),
        data_bound=data_bound(wait),
        tokens_per_s=tokens_per_step * len(measured) / window_s if tokens_per_step is not None else None,
        samples_per_s=samples_per_step * len(measured) / window_s,
        final_loss=measured[-1].loss,
        nonfinite_loss_steps=nonfinite_count(r.loss for r in measured),
    )


def nonfinite_count(losses: Iterable[float]) -> int:
    """How many of ``losses`` are NaN or infinite: ``runs.nonfinite_loss_steps`` of the measured
    steps' losses, for a job's own steps and for a result.json kept before the column existed."""
    return sum(not math.isfinite(x) for x in losses)


def slowest_rank_steps(per_rank: Sequence[Sequence[StepRecord]]) -> list[StepRecord]:
    """A data-parallel job's steps from its ranks' (same steps, same phases, by construction):
    at each step the slowest rank's time, since every rank waits for it in the gradient
    allreduce; the longest data wait; and the loss of the global batch, the mean over ranks
    (equal per-rank batches)."""
    n = min(len(r) for r in per_rank)
    out = []
    for i in range(n):
        at = [r[i] for r in per_rank]
        out.append(
            StepRecord(
                step=i,
                phase=at[0].phase,
                step_time_ms=max(r.step_time_ms for r in at),
                data_wait_ms=max(r.data_wait_ms for r in at),
                loss=float(np.mean([r.loss for r in at])),
            )
        )
    return out


@dataclass(frozen=True)
class RankFigures(Figures):
    """A data-parallel job's per-rank view; the job's own figures (tokens/s over the global
    batch, step times of the slowest rank at each step) are its :class:`StepFigures`."""

    tokens_per_s_per_rank: float | None
    samples_per_s_per_rank: float
    slowest_rank: int
    """The rank with the largest median measured step time."""
    slowest_rank_step_time_ms_median: float


def rank_figures(job: StepFigures, per_rank: Sequence[Sequence[StepRecord]]) -> RankFigures:
    nproc = len(per_rank)
    medians = [float(np.median([r.step_time_ms for r in recs if r.phase == "measure"])) for recs in per_rank]
    slowest = int(np.argmax(medians))
    return RankFigures(
        tokens_per_s_per_rank=job.tokens_per_s / nproc if job.tokens_per_s is not None else None,
        samples_per_s_per_rank=job.samples_per_s / nproc,
        slowest_rank=slowest,
        slowest_rank_step_time_ms_median=medians[slowest],
    )


def iqr(values: ArrayLike) -> float:
    """Interquartile range (p75 - p25, linear interpolation) of ``values``."""
    p25, p75 = np.percentile(np.asarray(values, dtype=float), [25, 75])
    return float(p75 - p25)


def steady(step_times_ms: Sequence[float], window: int, tolerance: float) -> bool:
    """The steady-state rule: the median of the last ``window`` step times is within
    ``tolerance`` (relative) of the median of the ``window`` steps before them."""
    if window < 1 or len(step_times_ms) < 2 * window:
        return False
    last = float(np.median(step_times_ms[-window:]))
    before = float(np.median(step_times_ms[-2 * window : -window]))
    return before > 0 and abs(last / before - 1.0) <= tolerance


@dataclass(frozen=True)
class Verdict(Figures):
    """Where a GPU run's step time goes; all None on CPU or without a profile (never guessed)."""

    gpu_busy_ms: float | None = None
    """Union of kernel and memcpy intervals per profiled step."""
    gpu_busy_fraction: float | None = None
    """gpu_busy_ms over the measured median step time."""
    bottleneck: str | None = None
    """``gpu``, ``host`` or ``data`` by :data:`perfsweep.names.BOTTLENECK_RULE`."""
    bottleneck_rule: str | None = None


@dataclass(frozen=True)
class JobPhases(Figures):
    """Where a job's wall time went besides its steps (``duration_s`` holds all of it, with the
    data's preparation and the storing), between the milestones of :class:`JobClock`. None where
    the job did not get that far."""

    process_start_ms: float | None = None
    """From asking for the job's process to its first word: a spawned job's new interpreter and its
    imports of torch and the runner; a forked job's fork (the first may wait for the job server's
    imports)."""
    setup_ms: float | None = None
    """From that first word to the first step's start: the device (a CUDA context), the memory
    prediction, the model, its optimizer and data (a data-parallel job's ranks started)."""
    after_steps_ms: float | None = None
    """From the end of the measured window to the job's result: on CPU the memory step and the
    matmul peak, then the profiled window and its trace's analysis, a memory snapshot's dump."""


@dataclass
class JobClock:
    """A job's milestones on the host's monotonic clock (seconds): the sweep's process reads it as
    it starts the job and as the job's first word and outcome arrive; the job sends its own
    reading at its first step's start and its measured window's end (perfsweep.runner.Reporter),
    where a message's arrival would say less (a window's steps are reported after it under
    ``timing=events``). A milestone not reached stays None, and so do the phases it bounds."""

    launched: float | None = None
    ready: float | None = None
    first_step_start: float | None = None
    """The job's ``steps`` milestone."""
    last_measured: float | None = None
    """The job's ``measured`` milestone: the window ended (a job that failed in it has none)."""
    ended: float | None = None

    def milestone(self, name: str, at: float) -> None:
        if name == "steps":
            self.first_step_start = at
        elif name == "measured":
            self.last_measured = at

    def heard(self, message: tuple) -> None:
        """A message from the job: its ``("ready", at)`` and ``("milestone", name, at)`` carry the
        job's own reading, so a sweep busy elsewhere when one arrived does not move time between
        phases; the rest are not the clock's."""
        if message[0] == "ready":
            self.ready = message[1]
        elif message[0] == "milestone":
            self.milestone(message[1], message[2])

    def phases(self) -> JobPhases:
        def ms(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else max(0.0, (end - start) * 1000.0)

        return JobPhases(
            process_start_ms=ms(self.launched, self.ready),
            setup_ms=ms(self.ready, self.first_step_start),
            after_steps_ms=ms(self.last_measured, self.ended),
        )


def gpu_busy_fraction(gpu_busy_ms: float, step_ms: float) -> float:
    """Share of a step the GPU was busy. ``step_ms`` should be a measured (unprofiled) step time:
    the profiled steps are slowed by the profiler, which would dilute the share."""
    return gpu_busy_ms / step_ms if step_ms > 0 else float("nan")


def data_bound(data_wait_fraction: float | None) -> bool | None:
    """The loader, not the model, sets the pace: more than :data:`DATA_BOUND_WAIT_FRACTION` of the
    measured steps' time went to waiting for the next batch (the seed course's test that the data
    loader is not the bottleneck). Stored per run as ``runs.data_bound``; on CPU and GPU alike."""
    return None if data_wait_fraction is None else bool(data_wait_fraction > DATA_BOUND_WAIT_FRACTION)


def prediction_error(predicted_bytes: int | None, measured_bytes: int | None) -> float | None:
    """``runs.predicted_peak_error``: predicted / measured - 1 (negative: the ledger predicted too little)."""
    if not predicted_bytes or not measured_bytes:
        return None
    return predicted_bytes / measured_bytes - 1.0


def bottleneck_verdict(
    gpu_busy_ms: float | None, step_time_ms_median: float | None, data_wait_fraction: float | None
) -> Verdict:
    """``gpu_busy_fraction`` and the ``bottleneck`` verdict of a run, by :data:`BOTTLENECK_RULE`.

    Busy time comes from the profiled steps, the step time from the measured (unprofiled) ones,
    so the profiler's own overhead does not dilute the fraction.
    """
    if gpu_busy_ms is None or not step_time_ms_median:
        return Verdict()
    busy = gpu_busy_fraction(gpu_busy_ms, step_time_ms_median)
    if data_bound(data_wait_fraction):
        verdict = "data"
    elif busy >= GPU_BOUND_BUSY_FRACTION:
        verdict = "gpu"
    else:
        verdict = "host"
    return Verdict(gpu_busy_ms, busy, verdict, BOTTLENECK_RULE)


@dataclass(frozen=True)
class Utilisation(Figures):
    """Model FLOP/s (not hardware FLOP/s: recomputation is not counted) and their share of the
    device's dense peak in the run's compute dtype."""

    model_tflops_per_s: float
    mfu: float | None
    """None where the device has no known peak (CPU, an unlisted GPU): never a guess."""
    mfu_peak_flops: float | None
    mfu_compute_dtype: str


def model_flops_utilisation(
    flops_per_sample: float, samples_per_s: float, peak_flops: float | None, compute_dtype: str
) -> Utilisation:
    """From FLOPs per sample and samples/s: the same product as per token for a token model, and
    defined for every model (``model.unit``)."""
    model_flops_per_s = flops_per_sample * samples_per_s
    return Utilisation(
        model_tflops_per_s=model_flops_per_s / 1e12,
        mfu=model_flops_per_s / peak_flops if peak_flops else None,
        mfu_peak_flops=peak_flops,
        mfu_compute_dtype=compute_dtype,
    )


def flops_per_unit(
    flops_per_step: float, tokens_per_step: int | None, samples_per_step: int
) -> tuple[float | None, float]:
    """(``flops_per_token``, ``flops_per_sample``) of a step's training FLOPs; per token is None for
    a model that counts samples (``tokens_per_step`` None)."""
    return (flops_per_step / tokens_per_step if tokens_per_step else None), flops_per_step / samples_per_step


def cpu_flops_utilisation(
    model_tflops_per_s: float | None,
    compute_dtype: str | None,
    fp32_flops: float | None,
    bf16_flops: float | None,
    run_flops: float | None = None,
) -> float | None:
    """A CPU run's model FLOP/s over the best matmul rate measured in its compute dtype (bf16
    under bf16 autocast, else fp32): the sweep's, before the jobs (``fp32_flops``, ``bf16_flops``),
    or the run's own, after its measured steps (``run_flops``), whichever is higher. Other load on
    the machine can only lower a measured rate, and the peak is what the CPU can do. None without
    a measured rate."""
    sweep_flops = bf16_flops if compute_dtype == "bf16" else fp32_flops
    peak = max((f for f in (sweep_flops, run_flops) if f), default=None)
    if model_tflops_per_s is None or peak is None:
        return None
    return model_tflops_per_s * 1e12 / peak


def compile_payback_steps(
    compile_time_ms: float, eager_step_ms: float | None, compiled_step_ms: float | None
) -> float | None:
    """Steps after which torch.compile has paid for itself: compile time over the per-step saving
    against the eager twin. None where compiling did not make steps faster (never paid back)."""
    saving = (eager_step_ms or 0.0) - (compiled_step_ms or 0.0)
    return compile_time_ms / saving if saving > 0 else None


# --- figures derived from stored columns, for the summary, the report and the comparison -------
# They take pandas Series or numpy arrays (one value per run) so a report over 10,000 runs is
# one vectorised expression, and each rule lives here only.


def rate_unit(tokens_per_s: ArrayLike, samples_per_s: ArrayLike) -> str:
    """What a set of runs' headline throughput counts: ``tokens``, unless no run has tokens/s and
    some have samples/s (models with ``model.unit=samples``: images, rows)."""
    tokens, samples = np.asarray(tokens_per_s, dtype=float), np.asarray(samples_per_s, dtype=float)
    return "samples" if np.isnan(tokens).all() and not np.isnan(samples).all() else "tokens"


def throughput_range(
    throughput_per_s: ArrayLike,
    step_time_ms_median: ArrayLike,
    step_time_ms_p10: ArrayLike,
    step_time_ms_p90: ArrayLike,
):
    """(``_lo``, ``_hi``): the run's throughput scaled to its p90 and to its p10 step time,
    i.e. how steady the measured steps were (not a standard error). Scaled from the headline (the
    measured window's tokens over its wall time), so the range always holds it: taken from tokens
    per step over the step times alone, the time between steps put the headline below its range."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (
            throughput_per_s * step_time_ms_median / step_time_ms_p90,
            throughput_per_s * step_time_ms_median / step_time_ms_p10,
        )


def iqr_fraction(step_time_ms_iqr: ArrayLike, step_time_ms_median: ArrayLike):
    """IQR over median step time: the spread the noisy rule judges, for display."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return step_time_ms_iqr / step_time_ms_median


def profiled_step_ratio(profiled_step_ms: ArrayLike, step_time_ms_median: ArrayLike) -> float:
    """The largest profiled step (its stages' CPU time summed) over its run's measured median step:
    how much the profiler's own cost inflated the breakdown's bars (NaN where nothing is known)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.asarray(profiled_step_ms, float) / np.asarray(step_time_ms_median, float)
    return float(np.nanmax(ratio)) if np.isfinite(ratio).any() else float("nan")


def noisy_iqr(step_time_ms_iqr: ArrayLike, step_time_ms_median: ArrayLike):
    """True where IQR / median exceeds :data:`NOISY_IQR_FRACTION`; False where unknown. The body
    of a run's step times (:func:`noisy_steps`), and a config's repeats' throughput
    (:func:`perfsweep.configs.per_config`)."""
    iqr = np.asarray(step_time_ms_iqr, dtype=float)
    med = np.asarray(step_time_ms_median, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        flag = np.nan_to_num(iqr / med, nan=0.0, posinf=0.0) > NOISY_IQR_FRACTION
    index = getattr(step_time_ms_iqr, "index", None)
    if index is not None:  # a pandas Series in, a Series out (pandas is not imported here)
        return type(step_time_ms_iqr)(flag, index=index)
    return flag if flag.ndim else bool(flag)


def tail_fraction(step_time_ms_mean: ArrayLike, step_time_ms_median: ArrayLike):
    """How far the mean step time is off the median, as a share of the median: what a few slow
    (or fast) steps the IQR does not see did to the mean, and so to tokens/s."""
    with np.errstate(divide="ignore", invalid="ignore"):
        # |mean - median| / median, not |mean / median - 1|: 110 / 100 - 1 is 0.10000000000000009
        median = np.asarray(step_time_ms_median, float)
        return np.abs(np.asarray(step_time_ms_mean, float) - median) / median


def noisy_parts(step_time_ms_iqr: float, step_time_ms_median: float, step_time_ms_mean: float) -> tuple[bool, bool]:
    """Which parts of :data:`perfsweep.names.NOISY_RULE` a run's step times break: its IQR
    (:func:`noisy_iqr`) and its mean's distance from the median (:func:`tail_fraction`)."""
    tail = float(tail_fraction(step_time_ms_mean, step_time_ms_median))
    return bool(noisy_iqr(step_time_ms_iqr, step_time_ms_median)), bool(
        np.isfinite(tail) and tail > NOISY_TAIL_FRACTION
    )


def noisy_steps(step_time_ms_iqr: float, step_time_ms_median: float, step_time_ms_mean: float) -> bool:
    """A run's ``noisy`` flag: either part of :func:`noisy_parts`."""
    return any(noisy_parts(step_time_ms_iqr, step_time_ms_median, step_time_ms_mean))


def speedup(tokens_per_s: ArrayLike, baseline_tokens_per_s: float | None):
    """tokens/s over the baseline's (NaN without a baseline)."""
    if not baseline_tokens_per_s:
        return tokens_per_s * np.nan
    return tokens_per_s / baseline_tokens_per_s


def change_pct(tokens_per_s_a: ArrayLike, tokens_per_s_b: ArrayLike):
    """A's tokens/s relative to B's, in percent (positive: A is faster)."""
    return (tokens_per_s_a / tokens_per_s_b - 1.0) * 100.0


def ranges_overlap(lo_a: ArrayLike, hi_a: ArrayLike, lo_b: ArrayLike, hi_b: ArrayLike):
    """True where the two throughput ranges overlap: how a compare decides without steps to resample (imported rows)."""
    return np.maximum(lo_a, lo_b) <= np.minimum(hi_a, hi_b)


# --- intervals ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A figure with its bootstrap confidence interval."""

    value: float
    lo: float
    hi: float
    confidence: float

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi


def _resample(x: np.ndarray, n_boot: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """``n_boot`` resamples of ``x`` (rows). ``block`` > 1 draws runs of consecutive values (a moving
    block bootstrap), so steps that drift together are not treated as independent draws."""
    n = len(x)
    block = max(1, min(block, n))
    k = -(-n // block)
    starts = rng.integers(0, n - block + 1, size=(n_boot, k))
    idx = (starts[:, :, None] + np.arange(block)).reshape(n_boot, k * block)[:, :n]
    return x[idx]


def run_draws(
    tokens_per_s: Sequence[float], step_times_ms: Sequence[Sequence[float]], n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """``n_boot`` draws of each run's tokens/s (rows): its steps resampled in blocks of
    :func:`step_block` of its own length, its tokens/s scaled by mean(measured) / mean(resampled).
    Runs of one length are resampled together, in chunks, so thousands of runs take about a second;
    one run draws the same numbers as :func:`_resample` would."""
    out = np.empty((len(step_times_ms), n_boot))
    lengths: dict[int, list[int]] = {}
    for i, steps in enumerate(step_times_ms):
        lengths.setdefault(len(steps), []).append(i)
    for n, rows in lengths.items():
        block = step_block(n)
        k = -(-n // block)
        x = np.array([step_times_ms[i] for i in rows], dtype=float)
        scale = np.asarray(tokens_per_s, float)[rows] * x.mean(axis=1)
        for at in range(0, len(rows), chunk := max(1, 2_000_000 // (n_boot * n))):
            sub = x[at : at + chunk]
            starts = rng.integers(0, n - block + 1, size=(len(sub), n_boot, k))
            idx = (starts[..., None] + np.arange(block)).reshape(len(sub), n_boot, k * block)[..., :n]
            means = sub[np.arange(len(sub))[:, None, None], idx].mean(axis=2)
            out[rows[at : at + chunk]] = scale[at : at + chunk, None] / means
    return out


def ratio_interval(
    numerator: ArrayLike,
    denominator: ArrayLike,
    *,
    stat: Callable[..., Any] = np.median,
    confidence: float = 0.95,
    n_boot: int = 10_000,
    block: int = 1,
    seed: int = 0,
) -> Interval:
    """stat(numerator) / stat(denominator) with a percentile bootstrap interval, the two samples
    resampled independently (``block``: see :func:`_resample`). ``stat`` takes ``axis=``."""
    a = np.asarray(numerator, dtype=float)
    b = np.asarray(denominator, dtype=float)
    if len(a) == 0 or len(b) == 0:
        raise ValueError("ratio_interval needs values on both sides")
    draws_a = stat(_resample(a, n_boot, block, np.random.default_rng(seed)), axis=1)
    ratios = draws_a / stat(_resample(b, n_boot, block, np.random.default_rng(seed + 1)), axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return Interval(float(stat(a) / stat(b)), float(lo), float(hi), confidence)


def step_block(n_steps: int) -> int:
    """Block length for resampling ``n_steps`` consecutive step times: n^(1/3), rounded, at least
    1 (the usual order for a moving block bootstrap), so 10 steps go in blocks of 2, 30 in 3."""
    return max(1, round(n_steps ** (1 / 3)))


NO_DIFFERENCE = "no measurable difference"


def verdict(interval: Interval) -> str:
    """faster / slower when the whole interval of a speedup is above / below 1, else no
    measurable difference."""
    if interval.contains(1.0):
        return NO_DIFFERENCE
    return "faster" if interval.lo > 1.0 else "slower"


@dataclass(frozen=True)
class Speedup(Figures):
    """A config's tokens/s over the baseline config's, with its interval; ``runs`` columns."""

    speedup: float
    speedup_ci_lo: float
    speedup_ci_hi: float
    speedup_basis: str
    speedup_verdict: str


RATIO_DRAWS_BUDGET = 20_000_000
"""Most values resampled for one set of speedups (draws x the steps, or runs, of every config):
10,000 draws per config while that fits, fewer (at least 1,000) for large sweeps, so the end of a
10,000-run sweep, or a report against a baseline of your own, stays in seconds."""


def speedups(configs: Sequence[Throughput], baseline: Throughput, confidence: float = 0.95) -> list[Speedup | None]:
    """Each config's tokens/s over the baseline's (the median over repeats) with a percentile
    bootstrap interval and verdict; None where there is nothing to resample (one run without
    stored steps). Over repeats when both have more than one run, else over each run's steps (see
    :class:`Throughput`). The baseline is drawn once per basis (seed 1), each config with seed 0."""
    size = sum(len(t.throughput_per_s_runs) + sum(map(len, t.step_times_ms_runs)) for t in configs)
    n_boot = int(np.clip(RATIO_DRAWS_BUDGET // max(size, 1), 1_000, 10_000))
    reference: dict[str, np.ndarray] = {}
    out: list[Speedup | None] = []
    for t in configs:
        if (basis := t.basis(baseline)) is None:
            out.append(None)
            continue
        if basis not in reference:
            reference[basis] = baseline.replicates(basis, np.random.default_rng(1), n_boot)
        draws = t.replicates(basis, np.random.default_rng(0), n_boot) / reference[basis]
        iv = percentile_interval(t.value / baseline.value, draws, confidence)
        out.append(Speedup(iv.value, iv.lo, iv.hi, basis, verdict(iv)))
    return out


@dataclass(frozen=True)
class Throughput:
    """One config's tokens/s as resampling sees it: each ok run's stored tokens/s and its
    measured step times in order ([] where none are stored, as for an imported row).

    The figure is the median of the runs' tokens/s, what the summary and the report show. Over
    repeats, a draw is the median of resampled runs. Over steps, each run's steps are resampled
    in blocks of :func:`step_block` of its own step count, never across runs, and the run's
    tokens/s is scaled by how much faster or slower the resampled steps were than the measured
    ones; a draw is the median of those runs. So the interval is always around the figure shown.
    """

    throughput_per_s_runs: Sequence[float]
    step_times_ms_runs: Sequence[Sequence[float]]

    def basis(self, *others: Throughput) -> str | None:
        """ "repeats" when every side has more than one run, else "steps" when every run of every
        side has measured steps, else None: one run without stored steps has no interval."""
        sides = (self, *others)
        if all(len(t.throughput_per_s_runs) > 1 for t in sides):
            return "repeats"
        if all(len(t.throughput_per_s_runs) > 0 and all(len(s) for s in t.step_times_ms_runs) for t in sides):
            return "steps"
        return None

    def replicates(self, basis: str, rng: np.random.Generator, n_boot: int = 10_000) -> np.ndarray:
        """``n_boot`` bootstrap draws of the config's tokens/s (see the class)."""
        runs = np.asarray(self.throughput_per_s_runs, float)
        if basis == "repeats":
            return np.median(_resample(runs, n_boot, 1, rng), axis=1)
        return np.median(run_draws(runs, self.step_times_ms_runs, n_boot, rng), axis=0)

    @property
    def value(self) -> float:
        return float(np.median(self.throughput_per_s_runs))

    def ratio(self, other: Throughput, confidence: float = 0.95) -> Interval:
        """This config's tokens/s over ``other``'s with its interval (:func:`speedups`; a NaN
        interval without a basis)."""
        if (s := speedups([self], other, confidence)[0]) is not None:
            return Interval(s.speedup, s.speedup_ci_lo, s.speedup_ci_hi, confidence)
        value = (
            self.value / other.value if len(self.throughput_per_s_runs) and len(other.throughput_per_s_runs) else np.nan
        )
        return Interval(float(value), float("nan"), float("nan"), confidence)


def percentile_interval(value: float, replicates: np.ndarray, confidence: float = 0.95) -> Interval:
    """``value`` with the central ``confidence`` share of its bootstrap ``replicates``."""
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(replicates, [tail, 100.0 - tail])
    return Interval(float(value), float(lo), float(hi), confidence)


EFFECT_DRAWS_BUDGET = 5_000_000
"""Most values resampled for factor effects (draws x the steps, or runs, of all configs): 10,000
draws up to 500 values, fewer beyond, at least 500 (12 in each 2.5% tail: coarse, but with
thousands of configs the interval is narrow anyway), so the factor chart of a 10,000-run report
adds about a second."""


def effect_intervals(
    cells: Sequence[Sequence[Throughput]], signs: Sequence[np.ndarray], confidence: float = 0.95
) -> list[Interval]:
    """Design-of-experiments effects in % of the mean, with bootstrap intervals.

    ``cells``: for each cell of the on/off grid, the configs measured in it (their tokens/s are
    averaged); ``signs``: for each term, a -1/+1 per cell. An effect is mean(+1 cells) - mean(-1
    cells) as % of the mean over all cells; each bootstrap draw resamples every config (over repeats
    when every config has them, else over steps; see :class:`Throughput`) and recomputes all of it.
    Effects come back NaN when some config has neither repeats nor steps to resample.
    """
    flat = [t for cell in cells for t in cell]
    if not flat or (basis := flat[0].basis(*flat[1:])) is None:
        nan = float("nan")
        return [Interval(nan, nan, nan, confidence) for _ in signs]
    rng = np.random.default_rng(0)
    size = sum(
        len(t.throughput_per_s_runs) if basis == "repeats" else sum(map(len, t.step_times_ms_runs)) for t in flat
    )
    n_boot = int(np.clip(EFFECT_DRAWS_BUDGET // size, 500, 10_000))  # what one set of draws holds at once
    if basis == "repeats":
        per_config = np.array([t.replicates(basis, rng, n_boot) for t in flat])
    else:  # every run of every config in one vectorised call: a 10,000-config sweep in about a second
        tokens = [x for t in flat for x in t.throughput_per_s_runs]
        runs = run_draws(tokens, [x for t in flat for x in t.step_times_ms_runs], n_boot, rng)
        n_runs = np.array([len(t.throughput_per_s_runs) for t in flat])
        per_config = (
            runs
            if (n_runs == 1).all()
            else np.array([np.median(r, axis=0) for r in np.split(runs, np.cumsum(n_runs)[:-1])])
        )
    n_configs = np.array([len(cell) for cell in cells])
    draws = np.add.reduceat(per_config, np.concatenate([[0], np.cumsum(n_configs)[:-1]]), axis=0) / n_configs[:, None]
    point = np.array([np.mean([t.value for t in cell]) for cell in cells])
    _, draw_pct = effects(draws, signs)
    _, point_pct = effects(point, signs)
    return [percentile_interval(p, d, confidence) for p, d in zip(point_pct, draw_pct, strict=True)]


def effects(y: np.ndarray, signs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Effects of each term on ``y`` (one value per cell, or a row of draws per cell): mean over
    the cells at +1 minus mean at -1, and that in % of the mean over all cells (NaN cells skipped)."""
    effect = np.array([np.nanmean(y[s > 0], axis=0) - np.nanmean(y[s < 0], axis=0) for s in signs])
    return effect, 100.0 * effect / np.nanmean(y, axis=0)
