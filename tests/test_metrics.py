from __future__ import annotations

import numpy as np
import pytest

from perfsweep import metrics
from perfsweep.metrics import StepRecord, summarize
from perfsweep.names import NOISY_RULE


def test_summary_excludes_warmup_and_uses_the_window_wall_time():
    recs = [StepRecord(0, "warmup", 1000.0, 900.0, 9.0), StepRecord(1, "warmup", 500.0, 1.0, 8.0)]
    recs += [StepRecord(2 + i, "measure", t, 1.0, 7.0 - i) for i, t in enumerate([100.0, 200.0, 100.0, 100.0])]
    s = summarize(recs, tokens_per_step=512, samples_per_step=4, measure_wall_ms=512.0)
    assert s.first_step_ms == 1000.0
    assert s.step_time_ms_median == 100.0
    assert s.step_time_ms_p90 == pytest.approx(170.0)
    # 4 steps x 512 tokens over the window's 0.512 s wall time, not the mean of per-step rates
    assert s.tokens_per_s == pytest.approx(4 * 512 / 0.512)
    assert s.samples_per_s == pytest.approx(4 * 4 / 0.512)
    assert s.measure_wall_ms == 512.0
    assert s.data_wait_fraction == pytest.approx(4 / 500)
    assert s.final_loss == 4.0
    # spread: IQR 100..125 = 25 ms, a quarter of the median: noisy; CV from numpy
    assert s.step_time_ms_iqr == pytest.approx(25.0) and s.noisy is True
    assert s.step_time_cv == pytest.approx(np.std([100, 200, 100, 100], ddof=1) / 125.0)


def test_summary_needs_measured_steps_and_a_window():
    with pytest.raises(ValueError):
        summarize([StepRecord(0, "warmup", 1.0, 0.0, 1.0)], 1, 1, 1.0)
    with pytest.raises(ValueError, match="window"):
        summarize([StepRecord(0, "measure", 1.0, 0.0, 1.0)], 1, 1, 0.0)


def test_noisy_rule_is_iqr_over_median():
    steady_times = [100.0, 101.0, 99.0, 100.5, 100.2, 99.8]
    recs = [StepRecord(i, "measure", t, 0.0, 1.0) for i, t in enumerate(steady_times)]
    quiet = summarize(recs, 1, 1, sum(steady_times))
    assert quiet.noisy is False and quiet.step_time_ms_iqr < 2
    assert metrics.noisy_iqr(10.1, 100.0) is True and metrics.noisy_iqr(10.0, 100.0) is False  # > 10%, not >=
    assert metrics.noisy_iqr(5.0, 0.0) is False  # unknown is not noisy


def test_a_few_stalls_make_a_run_noisy_though_its_iqr_is_small():
    """One step of 20 at 30x the median: IQR 0, CV 265%, and the stall took 59% of the window's
    wall time, so tokens/s is 2.45x below what the median step says. The IQR rule alone called it
    quiet; the mean's distance from the median flags it, and the stored rule says which rule."""
    times = [100.0] * 19 + [3000.0]
    stalled = summarize([StepRecord(i, "measure", t, 0.0, 1.0) for i, t in enumerate(times)], 1, 1, sum(times))
    assert stalled.step_time_ms_iqr == 0.0 and stalled.step_time_cv > 2.5
    assert stalled.noisy is True and stalled.noisy_rule == NOISY_RULE
    assert metrics.noisy_iqr(stalled.step_time_ms_iqr, stalled.step_time_ms_median) is False  # what it was judged by
    # one step at 1.5x among 20 moves the mean 2.5%: CV 11%, and not noisy
    times = [100.0] * 19 + [150.0]
    mild = summarize([StepRecord(i, "measure", t, 0.0, 1.0) for i, t in enumerate(times)], 1, 1, sum(times))
    assert mild.step_time_cv > 0.1 and mild.noisy is False
    # > 10%, not >=, either way (a few fast steps as well as slow ones); unknown is not noisy
    assert metrics.noisy_steps(0.0, 100.0, 110.0) is False and metrics.noisy_steps(0.0, 100.0, 110.01) is True
    assert metrics.noisy_steps(0.0, 100.0, 89.9) is True and metrics.noisy_steps(10.1, 100.0, 100.0) is True
    assert metrics.noisy_steps(0.0, 0.0, 5.0) is False and metrics.noisy_steps(0.0, float("nan"), 5.0) is False


def test_steady_state_rule():
    assert not metrics.steady([100, 100, 100, 100, 100], 3, 0.02)  # fewer than two windows
    assert metrics.steady([500, 100, 101, 100, 99, 100], 3, 0.02)  # medians 101 vs 100: 1%
    assert not metrics.steady([300, 200, 150, 120, 110, 105], 3, 0.02)  # still falling: 110 vs 200
    assert not metrics.steady([100, 100, 100, 103, 103, 103], 3, 0.02)  # 3% apart
    assert not metrics.steady([1, 2, 3], 0, 0.02)  # window 0: never "steady" (the check is off)


@pytest.mark.parametrize(
    ("device", "dtype", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),  # SXM5: 1,979 TFLOP/s with sparsity, halved
        ("NVIDIA H100 80GB HBM3", "fp32", 67e12),  # CUDA cores; torch leaves TF32 off for matmuls
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5e12),
        ("NVIDIA H100 PCIe", "fp16", 756e12),  # the longer name wins over "H100"
        ("NVIDIA H100 NVL", "bf16", 835.5e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
        ("AMD EPYC 7B13", "bf16", None),  # a CPU: no MFU, never a guess
        (None, "bf16", None),
    ],
)
def test_peak_flops_by_device_and_compute_dtype(device, dtype, peak):
    from perfsweep.envinfo import peak_flops

    assert peak_flops(device, dtype) == peak


def test_compute_dtype_follows_autocast_then_torchs_tf32_setting(monkeypatch):
    import torch

    from perfsweep.envinfo import compute_dtype

    assert compute_dtype(True, "fp16") == "fp16" and compute_dtype(True, "bf16") == "bf16"
    monkeypatch.delenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", raising=False)
    before = torch.backends.cuda.matmul.allow_tf32  # a torch setting object: no monkeypatch.setattr
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert compute_dtype(False, "bf16") == "fp32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert compute_dtype(False, "bf16") == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    assert compute_dtype(False, "bf16") == "tf32"


def test_mfu_of_the_h100_runs_is_a_share_of_the_right_peak():
    """Every ok run of the shared H100 sweeps, re-derived with its compute dtype's peak: the fp32
    runs (amp=false) are measured against the 67 TFLOP/s CUDA-core peak, not the bf16 one, and no
    utilisation exceeds 1. Model FLOP/s are the ones measured there (tests/fixtures/h100)."""
    import sqlite3

    from perfsweep.envinfo import peak_flops
    from perfsweep.metrics import model_flops_utilisation
    from tests.h100 import H100

    con = sqlite3.connect(f"file:{H100 / 'results-fp16-seed-snapshot-gpt2.db'}?immutable=1", uri=True)
    rows = con.execute(
        "SELECT amp, amp_dtype, device_name, flops_per_token, tokens_per_s, mfu FROM runs WHERE status = 'ok'"
    ).fetchall()
    con.close()
    assert len(rows) >= 6
    for amp, amp_dtype, device, flops_per_token, tps, stored_mfu in rows:
        dtype = "fp32" if not amp else amp_dtype  # these jobs ran with torch's default (TF32 off)
        fig = model_flops_utilisation(flops_per_token, tps, peak_flops(device, dtype), dtype)
        assert 0 < fig.mfu <= 1.0
        assert fig.mfu == pytest.approx(fig.model_tflops_per_s * 1e12 / fig.mfu_peak_flops)
        if not amp:  # the old figure took the bf16 peak: 989/67 = 14.8x too low
            assert fig.mfu == pytest.approx(stored_mfu * 989 / 67, rel=1e-6)


def test_figure_groups_are_runs_columns():
    """Every typed figure is stored under its own name: a field without a column would be lost."""
    from dataclasses import fields

    from perfsweep import store

    columns = set(store.Run.__table__.columns.keys())
    for group in (metrics.StepFigures, metrics.Verdict, metrics.Utilisation):
        missing = {f.name for f in fields(group)} - columns
        assert not missing, f"{group.__name__}: {missing}"


def test_step_figures_compile_time_and_spread():
    recs = [StepRecord(0, "warmup", 900.0, 0.0, 9.0)] + [
        StepRecord(1 + i, "measure", t, 0.0, 1.0) for i, t in enumerate([10.0, 12.0, 11.0, 30.0, 10.0])
    ]
    s = summarize(recs, tokens_per_step=100, samples_per_step=1, measure_wall_ms=73.0)
    assert s.compile_time_ms == pytest.approx(900.0 - 11.0)  # first step beyond the median
    assert s.step_time_ms_std == pytest.approx(np.std([10.0, 12.0, 11.0, 30.0, 10.0], ddof=1))
    assert s.step_time_ms_p10 == pytest.approx(np.percentile([10, 12, 11, 30, 10], 10))


def test_display_figures_are_vectorised_and_honest_about_missing_values():
    import pandas as pd

    iqr = pd.Series([16.0, 4.0, np.nan, 5.0], index=[7, 8, 9, 10])
    median = pd.Series([100.0, 100.0, 20.0, 0.0], index=iqr.index)
    flags = metrics.noisy_iqr(iqr, median)
    assert list(flags.index) == [7, 8, 9, 10]  # aligned with the runs it flags
    assert flags.tolist() == [True, False, False, False]  # 16% > 10%; 4% is not; unknown is not noisy

    # 3,000 tokens/s over the window's wall time, median step 150 ms, p10 100 ms, p90 200 ms: the
    # range scales the headline (not tokens per step over the step times), so it always holds it
    lo, hi = metrics.throughput_range(pd.Series([3000.0]), pd.Series([150.0]), pd.Series([100.0]), pd.Series([200.0]))
    assert (lo.iloc[0], hi.iloc[0]) == (2250.0, 4500.0)

    assert metrics.speedup(pd.Series([300.0, 150.0]), 150.0).tolist() == [2.0, 1.0]
    assert metrics.speedup(pd.Series([300.0]), None).isna().all()  # no baseline: no speedup
    assert metrics.change_pct(110.0, 100.0) == pytest.approx(10.0)
    assert metrics.ranges_overlap(1.0, 2.0, 1.5, 3.0) and not metrics.ranges_overlap(1.0, 2.0, 2.5, 3.0)
    assert np.isnan(metrics.gpu_busy_fraction(5.0, 0.0)) and metrics.gpu_busy_fraction(5.0, 10.0) == 0.5


def test_compile_payback():
    assert metrics.compile_payback_steps(1000.0, eager_step_ms=12.0, compiled_step_ms=10.0) == 500.0
    assert metrics.compile_payback_steps(1000.0, eager_step_ms=10.0, compiled_step_ms=10.5) is None  # never
    assert metrics.compile_payback_steps(1000.0, eager_step_ms=None, compiled_step_ms=10.0) is None


def test_ratio_interval_finds_a_known_difference_and_no_difference():
    rng = np.random.default_rng(1)
    base = 100.0 * (1 + 0.05 * rng.standard_normal(40))
    faster = 90.0 * (1 + 0.05 * rng.standard_normal(40))  # 10% less time: a real difference
    same = 100.0 * (1 + 0.05 * rng.standard_normal(40))
    real = metrics.ratio_interval(base, faster)
    assert real.value == pytest.approx(np.median(base) / np.median(faster))
    assert real.lo > 1.0 and real.lo < real.value < real.hi and real.hi < 1.2
    none = metrics.ratio_interval(same, base)
    assert none.contains(1.0)
    # blocks of drifting steps widen the interval instead of faking precision
    drift = 100.0 + np.repeat(rng.standard_normal(8) * 5, 5)  # 8 levels, 5 steps each
    assert metrics.ratio_interval(drift, same, block=5).hi - metrics.ratio_interval(drift, same, block=5).lo > (
        metrics.ratio_interval(drift, same, block=1).hi - metrics.ratio_interval(drift, same, block=1).lo
    )


def test_speedups_over_steps_and_over_repeats():
    rng = np.random.default_rng(7)
    base_steps = list(100 + rng.normal(0, 3, 30))
    fast_steps = list(80 + rng.normal(0, 3, 30))

    def run(steps: list[float], tokens: int = 512) -> metrics.Throughput:
        return metrics.Throughput([tokens * 1000 / np.mean(steps)], [steps])

    def speedup(config: metrics.Throughput, baseline: metrics.Throughput) -> metrics.Speedup:
        (s,) = metrics.speedups([config], baseline)
        assert s is not None
        return s

    s = speedup(run(fast_steps), run(base_steps))
    assert s.speedup_basis == "steps" and s.speedup_verdict == "faster"
    assert s.speedup == pytest.approx(np.mean(base_steps) / np.mean(fast_steps))  # the runs' tokens/s
    assert s.speedup_ci_lo < s.speedup < s.speedup_ci_hi
    # twice the tokens per step in the same time is twice the throughput
    double = speedup(run(base_steps, 1024), run(base_steps))
    assert double.speedup == pytest.approx(2.0) and double.speedup_verdict == "faster"
    same = speedup(run(list(100 + rng.normal(0, 3, 30))), run(base_steps))
    assert same.speedup_verdict == metrics.NO_DIFFERENCE
    # repeats: the runs' tokens/s, resampled; 3 runs a side with 8% noise and no real difference
    rep = speedup(
        metrics.Throughput([1000.0, 1080.0, 950.0], [[]] * 3), metrics.Throughput([1010.0, 940.0, 1060.0], [[]] * 3)
    )
    assert rep.speedup_basis == "repeats" and rep.speedup_verdict == metrics.NO_DIFFERENCE
    assert rep.speedup == pytest.approx(1000.0 / 1010.0)
    slower = speedup(
        metrics.Throughput([500.0, 510.0, 490.0], [[]] * 3), metrics.Throughput([1010.0, 990.0, 1000.0], [[]] * 3)
    )
    assert slower.speedup_verdict == "slower" and slower.speedup_ci_hi < 1.0
    # two runs against one: over steps, each run's steps resampled on their own; the figure is the
    # median of the runs' tokens/s, the one the summary shows, and lies inside its interval
    a = metrics.Throughput([20480.0, 10240.0], [list(50 + rng.normal(0, 1, 20)), list(100 + rng.normal(0, 2, 20))])
    b = run(list(75 + rng.normal(0, 1.5, 20)), 1024)
    iv = a.ratio(b)
    assert a.basis(b) == "steps" and iv.value == pytest.approx(15360.0 / b.value)
    assert iv.lo < iv.value < iv.hi
    assert metrics.Throughput([1000.0], [[]]).basis(b) is None  # one run, no stored steps: no interval
    assert metrics.speedups([metrics.Throughput([1000.0], [[]])], b) == [None]
    # over repeats, the same draws as the plain two-sample bootstrap (ratio_interval's seeds)
    assert (rep.speedup, rep.speedup_ci_lo, rep.speedup_ci_hi) == pytest.approx(
        tuple(
            getattr(metrics.ratio_interval([1000.0, 1080.0, 950.0], [1010.0, 940.0, 1060.0]), k)
            for k in ("value", "lo", "hi")
        )
    )
    assert metrics.step_block(10) == 2 and metrics.step_block(30) == 3 and metrics.step_block(1) == 1


def test_a_jobs_phases_are_bounded_by_the_milestones_it_reached():
    """The milestones a job reached bound its phases; one it did not reach leaves the phases it
    bounds null, never a guess (a job that failed inside its window has no time after it, though
    its window's first steps were reported)."""
    clock = metrics.JobClock(launched=100.0)
    assert clock.phases().row() == {"process_start_ms": None, "setup_ms": None, "after_steps_ms": None}
    clock.heard(("ready", 101.25))  # the job's own reading, not the message's arrival
    clock.heard(("progress", "warmup", 0, 4, 12.5, 9.0))  # a step: not the clock's
    clock.heard(("milestone", "steps", 101.5))
    clock.ended = 104.0  # failed in its window: no "measured"
    assert clock.phases().row() == {"process_start_ms": 1250.0, "setup_ms": 250.0, "after_steps_ms": None}
    clock.milestone("measured", 103.0)
    clock.milestone("no-such-milestone", 0.0)  # a name it does not know changes nothing
    assert clock.phases().after_steps_ms == pytest.approx(1000.0)
    assert clock.phases().setup_ms == 250.0
