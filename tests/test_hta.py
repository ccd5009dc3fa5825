"""Holistic Trace Analysis (the ``hta`` package) opens perfsweep's traces as they are written.

perfsweep writes ``distributedInfo`` (rank 0 of 1) into every trace of a single-process job, so
HTA finds the rank without a hand edit. HTA rounds nanosecond timestamps by default, which breaks
its breakdowns on sub-microsecond kernels (an assertion on the H100 traces), hence
``HTA_DISABLE_NS_ROUNDING=1``, the one setting the README's command carries.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

pytest.importorskip("hta", reason="HolisticTraceAnalysis is not installed (the [test] extra brings it)")
from hta.trace_analysis import TraceAnalysis  # noqa: E402

from perfsweep import corpus  # noqa: E402
from perfsweep.runner import train  # noqa: E402
from tests.test_profiling import tiny_cfg  # noqa: E402

H100 = Path(__file__).parent / "fixtures" / "h100"


def test_hta_loads_a_perfsweep_job_folder_with_its_rank(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    cfg = tiny_cfg(tmp_path)
    job = tmp_path / "job"
    train(cfg, corpus.prepare(cfg.data), job, "amp=false", str(tmp_path))
    (trace,) = job.glob("trace_*.json.gz")
    meta = json.loads(gzip.decompress(trace.read_bytes()))["distributedInfo"]
    assert meta == {"backend": "gloo", "rank": 0, "world_size": 1}
    with caplog.at_level(logging.WARNING):
        analysis = TraceAnalysis(trace_dir=str(job))
    assert analysis.t.get_ranks() == [0]
    assert "does not have the rank" not in caplog.text


def test_hta_breakdowns_run_on_an_h100_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The H100 trace (written before perfsweep added distributedInfo, so added here as perfsweep
    now writes it) through HTA's temporal, kernel and idle-time breakdowns."""
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    src = json.loads(gzip.decompress((H100 / "minigpt_seed_fp16_amp1_ckpt0.trace.json.gz").read_bytes()))
    src["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 1}
    (tmp_path / "trace.json").write_text(json.dumps(src))
    analysis = TraceAnalysis(trace_dir=str(tmp_path))
    temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
    assert temporal["rank"] == 0 and temporal["compute_time(us)"] > 0
    # HTA agrees that this AMP config leaves the GPU mostly idle (perfsweep: 36% busy)
    assert temporal["idle_time_pctg"] > 50
    kernels = analysis.get_gpu_kernel_breakdown(visualize=False)[0]
    assert "COMPUTATION" in set(kernels["kernel_type"])
    idle = analysis.get_idle_time_breakdown(visualize=False)[0]
    assert idle.set_index("idle_category").loc["host_wait", "idle_time_ratio"] > 0.5
