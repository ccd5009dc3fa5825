"""CUDA-only checks of what CPU runs cannot show; each skips on a machine without a GPU."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from perfsweep import data
from perfsweep.config import (
    AmpDtype,
    DataConfig,
    DataKind,
    Device,
    ModelConfig,
    PerfsweepConfig,
    ProfileConfig,
    StepsConfig,
)
from perfsweep.runner import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)")

MODEL = ModelConfig(name="gpu-small", n_layers=4, n_heads=4, d_model=256, d_ff=1024, max_seq_len=512)


def cfg(tmp_path: Path, **kw) -> PerfsweepConfig:
    return PerfsweepConfig(
        device=Device.cuda, batch=8, seq_len=256, model=MODEL,
        data=DataConfig(name="syn", kind=DataKind.synthetic, synthetic_vocab=8192, synthetic_tokens=200_000,
                        vocab_limit=None, cache_dir=str(tmp_path / "cache")),
        steps=StepsConfig(warmup=3, measure=5), **kw,
    )


def run(c: PerfsweepConfig, tmp_path: Path, label: str) -> dict:
    return train(c, data.prepare(c.data), tmp_path / label, label, str(tmp_path))


def test_cuda_memory_stage_device_time_and_kernels(tmp_path: Path):
    r = run(cfg(tmp_path, amp=True), tmp_path, "amp")
    assert r["device_type"] == "cuda"
    assert r["peak_allocated_bytes"] > 0 and r["peak_reserved_bytes"] >= r["peak_allocated_bytes"]
    assert r["peak_mem_bytes"] == r["peak_allocated_bytes"]
    stages = {s["stage"]: s for s in r["stages"]}
    assert stages["forward"]["device_time_source"] == "cuda_kernels"
    assert stages["forward"]["device_time_ms"] > 0 and stages["backward"]["device_time_ms"] > 0
    assert any(o["sort_by"] == "self_device" and o["self_device_ms"] > 0 for o in r["ops"])


def test_fp16_uses_grad_scaler_and_trains(tmp_path: Path):
    r = run(cfg(tmp_path, amp=True, amp_dtype=AmpDtype.fp16), tmp_path, "fp16")
    assert r["final_loss"] == r["final_loss"]  # not NaN
    assert r["tokens_per_s"] > 0


def test_memory_snapshot_is_written(tmp_path: Path):
    r = run(cfg(tmp_path, profile=ProfileConfig(memory_snapshot=True, active=1)), tmp_path, "snap")
    path = Path(r["memory_snapshot_path"])
    snap = pickle.loads(path.read_bytes())
    assert "segments" in snap and "device_traces" in snap


def test_checkpointing_lowers_cuda_peak(tmp_path: Path):
    base = run(cfg(tmp_path), tmp_path, "base")
    ck = run(cfg(tmp_path, ckpt=True), tmp_path, "ckpt")
    assert ck["peak_allocated_bytes"] < base["peak_allocated_bytes"]
