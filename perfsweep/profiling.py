"""The profiled window: torch.profiler over a few steps after the timed ones, and what we keep of it.

The window runs after the measured steps, so profiler overhead can never leak into the timed
figures. Its products are the ``stages`` table (per-stage CPU wall time and GPU time), the
``kernels`` table (GPU time by kernel category), GPU busy time, the ``ops`` table (top
operators), a Chrome/Perfetto trace and the profiler's text table.

Stage and kernel figures come from the exported trace through :mod:`perfsweep.trace`, the same
analysis ``perfsweep trace FILE`` runs: each kernel is attributed to the stage whose CPU range
contains its launch, on any thread (autograd launches backward kernels from its own thread, which
the profiler's parent/child attribution misses). We prefer that to CUDA events around each stage
because events would need a synchronisation per stage, changing the very overlap we want to
observe, whereas attribution from the trace costs nothing at run time.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from perfsweep import trace as trace_mod
from perfsweep.config import ProfileConfig
from perfsweep.names import DEVICE_TIME_BY_LAUNCH, DEVICE_TIME_SAME_AS_CPU, PROFILER_STEP_PREFIX, STAGES

log = logging.getLogger(__name__)


def _us(evt: Any, *names: str) -> float:
    """First present attribute of ``names`` (torch renamed cuda_* to device_* in 2.x), in microseconds."""
    for n in names:
        v = getattr(evt, n, None)
        if v is not None:
            return float(v)
    return 0.0


def self_device_us(evt: Any) -> float:
    return _us(evt, "self_device_time_total", "self_cuda_time_total")


def device_total_us(evt: Any) -> float:
    return _us(evt, "device_time_total", "cuda_time_total")


@contextlib.contextmanager
def stage(name: str, nvtx: bool = False) -> Iterator[None]:
    """Annotate a stage for torch.profiler (and Nsight Systems when ``nvtx``).

    Outside a profiler a record_function range still costs ~8 us to enter and leave (measured:
    benchmarks/bench_stage_labels.py, docs/benchmarks.md), so the runner labels only the steps
    of the profiled window; the timed steps run unlabelled.
    """
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


@dataclass
class ProfileResult:
    stages: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    ops: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    gpu_busy_ms: float | None = None
    """Union of GPU kernel intervals per profiled step; None on CPU."""
    collective_ms: float | None = None
    """Time per profiled step a collective ran (perfsweep.trace.TraceAnalysis.collective_ms)."""


class ProfiledWindow:
    """Context manager around the profiled steps; call :meth:`step` after each training step.

    ``steps_needed`` tells the caller how many steps to run inside the window.
    """

    def __init__(
        self, cfg: ProfileConfig, device: torch.device, out_dir: Path, label: str, measured_step_ms: float | None = None
    ) -> None:
        """``measured_step_ms``: the median of the job's measured (unprofiled) steps, written into
        the trace (trace.PERFSWEEP_TRACE_INFO) so that ``perfsweep trace`` takes the busy share
        of it, as the run's stored ``gpu_busy_fraction`` does, not of the profiler-slowed step."""
        self.cfg = cfg
        self.measured_step_ms = measured_step_ms
        self.device = device
        self.out_dir = out_dir
        self.label = label
        self.on_cuda = device.type == "cuda"
        self.result = ProfileResult()
        self._prof: profile | None = None

    @property
    def steps_needed(self) -> int:
        return self.cfg.wait + self.cfg.warmup + self.cfg.active

    def __enter__(self) -> ProfiledWindow:
        activities = [ProfilerActivity.CPU]
        if self.on_cuda:
            activities.append(ProfilerActivity.CUDA)
        handler = None
        if self.cfg.tensorboard:
            handler = torch.profiler.tensorboard_trace_handler(str(self.out_dir / "tensorboard"))
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=self.cfg.wait, warmup=self.cfg.warmup, active=self.cfg.active, repeat=1),
            on_trace_ready=handler,
            record_shapes=self.cfg.record_shapes,
            profile_memory=self.cfg.profile_memory,
            with_stack=self.cfg.with_stack,
            with_flops=True,
        )
        if not (dist.is_available() and dist.is_initialized()):
            # Holistic Trace Analysis reads the rank from distributedInfo; torch writes it only for
            # an initialised process group, so a single-process job says rank 0 of 1 itself.
            backend = "nccl" if self.on_cuda else "gloo"
            self._prof.preset_metadata_json(
                "distributedInfo", json.dumps({"backend": backend, "rank": 0, "world_size": 1})
            )
        if self.measured_step_ms and math.isfinite(self.measured_step_ms):
            info = {"measured_step_ms": self.measured_step_ms}
            self._prof.preset_metadata_json(trace_mod.PERFSWEEP_TRACE_INFO, json.dumps(info))
        if self.cfg.nvtx and self.on_cuda:
            torch.cuda.cudart().cudaProfilerStart()
        self._prof.__enter__()
        return self

    def step(self) -> None:
        assert self._prof is not None
        self._prof.step()

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._prof is not None
        self._prof.__exit__(exc_type, exc, tb)
        if self.cfg.nvtx and self.on_cuda:
            torch.cuda.cudart().cudaProfilerStop()
        if exc_type is None:
            self._collect(self._prof)

    # ------------------------------------------------------------------------------------

    def _collect(self, prof: profile) -> None:
        active = self.cfg.active
        averages = prof.key_averages()
        self.result.ops = op_table(averages, active, self.cfg.top_n, self.on_cuda)

        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"trace_{self.label}.json.gz"
        if self.cfg.tensorboard:
            # tensorboard_trace_handler has already saved this trace (a profile saves once);
            # our named .json.gz is a compressed copy of its file.
            tb_files = sorted((self.out_dir / "tensorboard").glob("*.pt.trace.json"), key=lambda f: f.stat().st_mtime)
            trace.write_bytes(gzip.compress(tb_files[-1].read_bytes()))
            for f in tb_files:
                self._artifact("tensorboard_trace", f)
        else:
            prof.export_chrome_trace(str(trace))
        self._artifact("trace", trace)
        # where the job sees several GPUs, its own one: work a custom model runs on another is not merged in
        gpu = None
        if self.on_cuda and torch.cuda.device_count() > 1:
            gpu = self.device.index if self.device.index is not None else torch.cuda.current_device()
        analysis = trace_mod.analyze(trace, require_gpu=False, device=gpu)
        self.result.stages = stage_rows(analysis, self.on_cuda)
        self.result.collective_ms = analysis.collective_ms
        if self.on_cuda:
            self.result.gpu_busy_ms = analysis.gpu_busy_ms
            self.result.kernels = kernel_rows(analysis)
        sort_key = "self_device_time_total" if self.on_cuda else "self_cpu_time_total"
        table = self.out_dir / f"profile_{self.label}.txt"
        table.write_text(averages.table(sort_by=sort_key, row_limit=self.cfg.top_n))
        self._artifact("profiler_table", table)

    def _artifact(self, kind: str, path: Path) -> None:
        self.result.artifacts.append({"kind": kind, "path": str(path.resolve()), "bytes": path.stat().st_size})


def stage_rows(analysis: trace_mod.TraceAnalysis, on_cuda: bool) -> list[dict[str, Any]]:
    """Rows of ``stages``: per-step CPU wall time of each stage and the GPU time it launched."""
    return [
        {
            "stage": name,
            "cpu_time_ms": cpu_ms,
            "device_time_ms": analysis.stage_gpu_ms[name] if on_cuda else cpu_ms,
            "device_time_source": DEVICE_TIME_BY_LAUNCH if on_cuda else DEVICE_TIME_SAME_AS_CPU,
            "calls": analysis.stage_calls[name],
        }
        for name, cpu_ms in analysis.stage_cpu_ms.items()
    ]


def kernel_rows(analysis: trace_mod.TraceAnalysis) -> list[dict[str, Any]]:
    """Rows of ``kernels``: GPU time and kernel count per step of each category present."""
    return [
        {"category": c, "ms_per_step": st.ms_per_step, "kernels_per_step": st.kernels_per_step}
        for c, st in analysis.categories.items()
    ]


def op_table(averages: Any, active_steps: int, top_n: int, on_cuda: bool) -> list[dict[str, Any]]:
    """Top operators by self device time (CUDA only) and by self CPU time.

    Times and the ``*_per_step`` columns are per profiled step; ``calls`` and ``flops`` are the
    totals over the window's ``active_steps`` (their first meaning, kept for old queries).
    """
    # key_averages names the step ranges "ProfilerStep*" (the trace: "ProfilerStep#N")
    ops = [a for a in averages if a.key not in STAGES and not a.key.startswith(PROFILER_STEP_PREFIX.rstrip("#"))]
    sorts: list[tuple[str, Any]] = [("self_cpu", lambda a: _us(a, "self_cpu_time_total"))]
    if on_cuda:
        sorts.insert(0, ("self_device", self_device_us))
    rows = []
    for sort_by, key in sorts:
        ranked = sorted(ops, key=key, reverse=True)[:top_n]
        for rank, a in enumerate(ranked, start=1):
            flops = getattr(a, "flops", 0) or 0
            rows.append(
                {
                    "sort_by": sort_by,
                    "rank": rank,
                    "name": a.key,
                    "calls": int(a.count),
                    "calls_per_step": a.count / active_steps,
                    "self_cpu_ms": _us(a, "self_cpu_time_total") / 1000.0 / active_steps,
                    "self_device_ms": self_device_us(a) / 1000.0 / active_steps if on_cuda else None,
                    "cpu_total_ms": _us(a, "cpu_time_total") / 1000.0 / active_steps,
                    "device_total_ms": device_total_us(a) / 1000.0 / active_steps if on_cuda else None,
                    "flops": int(flops) if flops else None,
                    "flops_per_step": flops / active_steps if flops else None,
                }
            )
    return rows
