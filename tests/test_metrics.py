from __future__ import annotations

import numpy as np
import pytest

from perfsweep.metrics import StepRecord, percentile, summarize


@pytest.mark.parametrize("q", [0, 10, 50, 90, 100])
def test_percentile_matches_numpy(q):
    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))


def test_summary_excludes_warmup_and_uses_total_time():
    recs = [StepRecord(0, "warmup", 1000.0, 900.0, 9.0), StepRecord(1, "warmup", 500.0, 1.0, 8.0)]
    recs += [StepRecord(2 + i, "measure", t, 1.0, 7.0 - i) for i, t in enumerate([100.0, 200.0, 100.0, 100.0])]
    s = summarize(recs, tokens_per_step=512, samples_per_step=4)
    assert s["first_step_ms"] == 1000.0
    assert s["step_time_ms_median"] == 100.0
    assert s["step_time_ms_p90"] == pytest.approx(170.0)
    # 4 steps x 512 tokens over 0.5 s, not the mean of per-step rates
    assert s["tokens_per_s"] == pytest.approx(4 * 512 / 0.5)
    assert s["samples_per_s"] == pytest.approx(4 * 4 / 0.5)
    assert s["data_wait_fraction"] == pytest.approx(4 / 500)
    assert s["final_loss"] == 4.0


def test_summary_needs_measured_steps():
    with pytest.raises(ValueError):
        summarize([StepRecord(0, "warmup", 1.0, 0.0, 1.0)], 1, 1)


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
        fig = model_flops_utilisation(flops_per_token, tps, peak_flops(device, dtype))
        assert 0 < fig["mfu"] <= 1.0
        assert fig["mfu"] == pytest.approx(fig["model_tflops_per_s"] * 1e12 / fig["mfu_peak_flops"])
        if not amp:  # the old figure took the bf16 peak: 989/67 = 14.8x too low
            assert fig["mfu"] == pytest.approx(stored_mfu * 989 / 67, rel=1e-6)
