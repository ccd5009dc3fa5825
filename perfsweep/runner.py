"""The job process: build model, data and optimizer for one grid point, train, measure, report.

This module runs inside a freshly spawned process (see :mod:`perfsweep.launcher`), so no
allocator state, compile cache or peak counter survives from one grid point into the next.
The step loop is the measured hot path: it synchronises once per step and does nothing else.

Order inside a job::

    warmup steps     excluded from every figure (allocator warm-up, autotuning, compile)
    measured steps   timed with perf_counter after a device synchronisation
    memory step      CPU only: one step with allocation tracking (see perfsweep.memory)
    profiled window  torch.profiler; produces stages, ops and the trace, never the timings
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from perfsweep import compile as compile_mod
from perfsweep import cpu_peak, distributed, interrupts, ledger, slots, task
from perfsweep import data as data_mod
from perfsweep.cli import first_line
from perfsweep.config import AmpDtype, Device, PerfsweepConfig, to_run_config
from perfsweep.corpus import TokenData
from perfsweep.envinfo import compute_dtype, environment, peak_flops
from perfsweep.memory import (
    MemoryProbe,
    MemorySnapshot,
    free_bytes,
    limit_address_space,
    limit_used_bytes,
    map_profiler,
    persistent_bytes,
    step_alloc_peak_bytes,
)
from perfsweep.metrics import (
    StepRecord,
    bottleneck_verdict,
    flops_per_unit,
    model_flops_utilisation,
    prediction_error,
    rank_figures,
    slowest_rank_steps,
    summarize,
)
from perfsweep.model import padded_vocab
from perfsweep.names import STAGES
from perfsweep.profiling import ProfiledWindow
from perfsweep.profiling import stage as labelled_stage
from perfsweep.timing import measure, resolve_timing, warm_up

log = logging.getLogger(__name__)

DATA_TO_DEVICE, FORWARD, BACKWARD, OPTIMIZER_STEP, ZERO_GRAD = STAGES  # the step's ranges, in order

_NO_LABEL = contextlib.nullcontext()


def _unlabelled(_name: str, _nvtx: bool) -> contextlib.nullcontext:
    """The timed steps' stand-in for :func:`perfsweep.profiling.stage`: a shared no-op (~0.2 us)."""
    return _NO_LABEL


class Reporter:
    """What a job tells its launcher over ``conn`` as it goes: each step (``reporter(phase, step,
    total_steps, step_time_ms, loss)``) and the milestones the launcher splits the job's time by
    (perfsweep.metrics.JobClock). A milestone carries this process's monotonic clock, which the
    launcher's process shares (Linux's CLOCK_MONOTONIC): with ``timing=events`` a window's steps
    are reported only after it, so their arrival does not say when the first one started."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def __call__(self, phase: str, step: int, total: int, ms: float, loss: float) -> None:
        self.conn.send(("progress", phase, step, total, ms, loss))

    def milestone(self, name: str) -> None:
        """``steps``: the first step is about to start; ``measured``: the measured window ended."""
        self.conn.send(("milestone", name, time.monotonic()))


def resolve_device(requested: Device) -> torch.device:
    if slots.wants_cuda(requested):
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda but torch sees no CUDA device; use device=cpu or device=auto")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def make_optimizer(model: torch.nn.Module, cfg: PerfsweepConfig) -> tuple[torch.optim.Optimizer, bool]:
    """AdamW with weight decay on matrices only (as GPT-2 training does), fused where supported.

    The groups are built afresh for each try: torch's optimizer writes its defaults into the
    dicts it is given (``fused: True`` too) before it refuses them, and a fallback handed the
    same dicts ran the fused kernel anyway, failing at the first step where there is none."""

    def groups() -> list[dict[str, Any]]:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        return [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]

    try:
        return torch.optim.AdamW(groups(), lr=cfg.lr, betas=(0.9, 0.95), fused=True), True
    except (RuntimeError, TypeError) as exc:
        log.info("fused AdamW unavailable here (%s); using the default implementation", exc)
        return torch.optim.AdamW(groups(), lr=cfg.lr, betas=(0.9, 0.95)), False


@dataclass
class Trainer:
    """Everything one training step touches, built once before the first step."""

    model: torch.nn.Module
    loss_fn: task.LossFn
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    batches: Any
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager]
    nvtx: bool
    scale_drops: list[torch.Tensor] = field(default_factory=list)
    """fp16 only: one 0-dim device tensor per step, true where GradScaler skipped the step (its
    scale dropped: inf/NaN gradients); kept on the device so counting costs no synchronisation."""
    labelled: bool = False
    """Enter the stage labels (record_function, NVTX). Only the profiled window needs them, and
    outside a profiler they cost ~8 us each, ~40 us a step (benchmarks/bench_stage_labels.py)."""

    def run(self) -> tuple[torch.Tensor, float]:
        """Queue one optimizer step; returns (loss tensor, data wait ms) without waiting for the
        device (``timing=events`` reads the losses after its window)."""
        dev, nvtx = self.device, self.nvtx
        stage = labelled_stage if self.labelled else _unlabelled
        t0 = time.perf_counter()
        with stage(DATA_TO_DEVICE, nvtx):
            batch = next(self.batches)
            t_data = time.perf_counter()
            batch = task.to_device(batch, dev)
        with stage(FORWARD, nvtx), self.autocast():
            loss = self.loss_fn(self.model, batch)
        with stage(BACKWARD, nvtx):
            self.scaler.scale(loss).backward()
        with stage(OPTIMIZER_STEP, nvtx):
            self.scaler.step(self.optimizer)
            if self.scaler.is_enabled():
                before = self.scaler._scale.clone()  # noqa: SLF001 - the public get_scale() synchronises
                self.scaler.update()
                self.scale_drops.append(self.scaler._scale < before)  # noqa: SLF001
            else:
                self.scaler.update()
        with stage(ZERO_GRAD, nvtx):
            self.optimizer.zero_grad(set_to_none=True)
        return loss, (t_data - t0) * 1000.0

    def step(self) -> tuple[float, float, float]:
        """One optimizer step timed by the host clock, device synchronised (``timing=sync``,
        warmup, profiled steps); returns (step_time_ms, data_wait_ms, loss)."""
        t0 = time.perf_counter()
        loss, wait_ms = self.run()
        loss_value = loss.item()  # waits for the step's device work
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - t0) * 1000.0, wait_ms, loss_value


@dataclass
class Built:
    """What :func:`build` made besides the trainer: the figures of the model and its batches."""

    raw: torch.nn.Module
    """The module before torch.compile (checkpointing applied)."""
    fused: bool
    tokens_per_step: int | None
    samples_per_step: int
    figures: dict[str, Any]
    """Parameter counts and FLOPs for ``runs`` (:func:`model_figures`)."""


def build(cfg: PerfsweepConfig, device: torch.device, token_data: TokenData | None) -> tuple[Trainer, Built]:
    torch.manual_seed(cfg.seed)
    vocab_size = token_data.vocab_size if token_data is not None else None
    raw = task.build_model(cfg.model, vocab_size, cfg.seq_len).to(device)
    raw.train()
    data_seed = cfg.seed + distributed.rank()  # each rank of a data-parallel job reads its own batches
    loader = data_mod.loader(
        cfg.data, token_data, cfg.batch, cfg.seq_len, cfg.workers, data_seed, pin_memory=device.type == "cuda"
    )
    batches = data_mod.infinite(loader)
    first = next(batches)  # what a batch holds; it is then trained on first, like any other
    tokens, samples = task.units(first, cfg.model.unit)
    batches = itertools.chain([first], batches)
    figures = model_figures(cfg, raw, first, vocab_size, tokens, samples)  # before checkpointing wraps it
    if cfg.ckpt:
        task.apply_checkpointing(raw, cfg.model)
    model: torch.nn.Module = distributed.wrap(raw, device)  # DDP in a rank of an nproc job
    if cfg.compile:
        model = compile_mod.apply(model, cfg.compile_backend, cfg.compile_mode)
    optimizer, fused = make_optimizer(raw, cfg)
    use_fp16 = cfg.amp and cfg.amp_dtype == AmpDtype.fp16
    if use_fp16 and device.type != "cuda":
        raise ValueError(
            f"amp_dtype=fp16 with device={cfg.device.value} resolved to {device}: fp16 needs CUDA; use bf16"
        )
    scaler = torch.amp.GradScaler(
        device.type, init_scale=cfg.grad_scaler_init_scale, enabled=use_fp16 and device.type == "cuda"
    )
    amp_dtype = torch.float16 if use_fp16 else torch.bfloat16

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=cfg.amp)

    loss_fn = task.loss_function(cfg.model)
    trainer = Trainer(model, loss_fn, optimizer, scaler, batches, device, autocast, cfg.profile.nvtx)
    return trainer, Built(raw, fused, tokens, samples, figures)


def model_figures(
    cfg: PerfsweepConfig, raw: torch.nn.Module, batch: Any, vocab_size: int | None, tokens: int | None, samples: int
) -> dict[str, Any]:
    """Parameter counts and FLOPs per token and per sample, with where the FLOPs came from
    (``flops_method``): the model's own formula where it has one, else FlopCounterMode
    (perfsweep.task.count_flops)."""
    out: dict[str, Any] = {
        "n_params": sum(p.numel() for p in raw.parameters()),  # parameters() yields tied weights once
        "n_params_non_embedding": raw.num_params(non_embedding=True) if hasattr(raw, "num_params") else None,
        "vocab_size": vocab_size,
        "vocab_size_padded": getattr(raw, "vocab_size_padded", None),
        "flops_per_token": None,
        "flops_per_sample": None,
        "flops_method": None,
    }
    if hasattr(raw, "flops_per_token") and tokens is not None and cfg.seq_len is not None:
        per_token, per_sample = flops_per_unit(float(raw.flops_per_token(cfg.seq_len)) * tokens, tokens, samples)
        return out | {"flops_per_token": per_token, "flops_per_sample": per_sample, "flops_method": "formula"}
    try:
        flops = task.count_flops(cfg.model, raw, batch, vocab_size, cfg.seq_len)
    except task.ContractError:
        raise  # the model breaks the contract: the run fails with that line
    except Exception as exc:  # noqa: BLE001 - counting is a figure, not the run: the run goes on
        log.warning("FLOPs not counted: %s", exc)
        flops = None
    if flops:
        per_token, per_sample = flops_per_unit(flops, tokens, samples)
        out.update(flops_per_token=per_token, flops_per_sample=per_sample, flops_method="flop_counter")
    return out


class PredictedOOM(Exception):
    """``skip_predicted_oom=true`` and the ledger predicts more than the device has free."""


def predict_memory(cfg: PerfsweepConfig, token_data: TokenData | None, device: torch.device) -> ledger.Ledger | None:
    """The job's memory ledger (perfsweep.ledger), for perfsweep's GPT on token data; None for
    other models, whose activations have no formula here."""
    gpt = cfg.model.gpt
    if gpt is None or token_data is None or cfg.seq_len is None:
        return None
    shape = ledger.GPTShape(
        n_layers=gpt.n_layers,
        n_heads=gpt.n_heads,
        d_model=gpt.d_model,
        d_ff=gpt.d_ff,
        max_seq_len=gpt.max_seq_len,
        vocab_padded=padded_vocab(token_data.vocab_size, gpt.vocab_multiple),
        bias=gpt.bias,
        dropout=gpt.dropout,
    )
    setting = ledger.Setting(cfg.batch, cfg.seq_len, cfg.amp, cfg.ckpt, cfg.compile, device.type)
    return ledger.predict_gpt(shape, setting)


def _skip_if_it_cannot_fit(predicted: ledger.Ledger, device: torch.device) -> None:
    free = free_bytes(device)
    if free is not None and not predicted.fits(free):
        gib = 2**30
        raise PredictedOOM(
            f"predicted peak {predicted.peak_bytes / gib:.2f} GiB > {free / gib:.2f} GiB free on {device} "
            f"less {ledger.SKIP_MARGIN_FRACTION:.0%} (skip_predicted_oom=true; the ledger is in runs.predicted_*)"
        )


def train(
    cfg: PerfsweepConfig,
    token_data: TokenData | None,
    job_dir: Path,
    label: str,
    launch_dir: str,
    progress: Reporter | None = None,
    result: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one grid point and return the row for ``runs`` with its child rows.

    ``result`` is filled as the job goes, so a caller that catches a failure still has the
    environment (and an OOM snapshot path) to store with it.
    """
    result = {} if result is None else result
    set_threads(cfg)
    device = resolve_device(cfg.device)
    result.update(environment(device, launch_dir))
    job_dir.mkdir(parents=True, exist_ok=True)
    predicted = predict_memory(cfg, token_data, device)
    if predicted is not None:
        result.update(predicted.row())  # on the row whatever the outcome: an oom row shows what was expected
        if cfg.skip_predicted_oom:
            _skip_if_it_cannot_fit(predicted, device)

    snapshot = None
    if cfg.profile.memory_snapshot and device.type == "cuda":
        snapshot = MemorySnapshot(job_dir, label, cfg.profile.memory_snapshot_max_entries)
        snapshot.start()
    try:
        probe_cpu = cfg.compile and cfg.compile_backend == "inductor" and device.type == "cpu"
        with compile_mod.cache_scope(cfg.compile_cache.value, job_dir, probe_cpu):
            return _train(cfg, token_data, job_dir, label, device, result, snapshot, progress)
    except BaseException:
        if snapshot is not None and snapshot.oom_path is not None:
            result["memory_snapshot_path"] = str(snapshot.oom_path)
        raise


def _train(
    cfg: PerfsweepConfig,
    token_data: TokenData | None,
    job_dir: Path,
    label: str,
    device: torch.device,
    result: dict[str, Any],
    snapshot: MemorySnapshot | None,
    progress: Reporter | None,
) -> dict[str, Any]:
    trainer, built = build(cfg, device, token_data)
    raw = built.raw
    result.update(
        built.figures,
        unk_token_share=token_data.unk_token_share if token_data is not None else None,
        optimizer_fused=built.fused,
        measure_steps=cfg.steps.measure,
        repeat_index=cfg.sweep.repeat_index,
        grid_index=cfg.sweep.grid_index,
    )

    probe = MemoryProbe(device)
    probe.before_training()
    records: list[StepRecord] = []
    steps = cfg.steps
    after_warmup = steps.measure + (device.type == "cpu") + cfg.profile.steps
    warmup_so_far = [steps.warmup]

    def report(rec: StepRecord) -> None:
        if rec.phase == "warmup":  # warmup may go on: the total grows with it
            warmup_so_far[0] = max(warmup_so_far[0], len(records))
        if progress is not None:
            progress(rec.phase, len(records), warmup_so_far[0] + after_warmup, rec.step_time_ms, rec.loss)

    def run_step(phase: str) -> None:
        ms, wait_ms, loss = trainer.step()
        records.append(StepRecord(len(records), phase, ms, wait_ms, loss))
        report(records[-1])

    if progress is not None:
        progress.milestone("steps")
    warm = warm_up(
        trainer,
        records,
        steps.warmup,
        steps.stable_window,
        steps.stable_tolerance,
        steps.warmup_cap,
        report,
        steps.max_warmup_s,
        agree=lambda done: distributed.all_agree(done, device),
    )
    mode = resolve_timing(cfg.timing.value, device)
    result.update(warmup_steps=warm.steps, measure_start_step=len(records), steady_state=warm.steady_state)
    result["timing_mode"] = mode
    if snapshot is not None:
        snapshot.pause()  # no allocator history cost inside the timed steps
    probe.start_measure()
    window_ms = measure(trainer, records, steps.measure, mode, report)
    if progress is not None:
        progress.milestone("measured")
    nproc = distributed.world_size()
    if distributed.active():  # the job's steps are its slowest rank's: gathered after the window, untimed
        gathered = distributed.gather((records, window_ms))
        per_rank = [list(r) for r, _ in gathered]
        records[:] = slowest_rank_steps(per_rank)
        window_ms = max(w for _, w in gathered)
    if snapshot is not None:
        snapshot.resume()
    result.update(probe.result())  # before any profiler adds its own memory
    dtype = compute_dtype(cfg.amp, cfg.amp_dtype.value)
    if device.type == "cpu":
        step_peak = step_alloc_peak_bytes(lambda: run_step("memory"))
        result["peak_allocated_bytes"] = persistent_bytes(raw, trainer.optimizer) + step_peak
        result["peak_mem_bytes"] = result["peak_allocated_bytes"]
        # read before the profiled window, whose own buffers do not decide whether a batch fits
        result["memory_limit_used_bytes"] = limit_used_bytes()
        if not distributed.active():  # a utilisation's denominator (perfsweep.summary), after the memory figures
            result["cpu_matmul_flops"] = cpu_matmul_peak("bf16" if dtype == "bf16" else "fp32")

    result["predicted_peak_error"] = prediction_error(
        result.get("predicted_peak_bytes"), result["peak_allocated_bytes"]
    )
    tokens, samples = built.tokens_per_step, built.samples_per_step
    summary = summarize(records, tokens and tokens * nproc, samples * nproc, window_ms)
    result.update(summary.row())
    if distributed.active():
        result.update(rank_figures(summary, per_rank).row())
    peak = peak_flops(result["device_name"], dtype) if device.type == "cuda" else None
    if result["flops_per_sample"] is not None:
        peak_all = peak * nproc if peak is not None else None  # every rank's GPU
        result.update(model_flops_utilisation(result["flops_per_sample"], summary.samples_per_s, peak_all, dtype).row())
    result.update(grad_scaler_figures(trainer, result["measure_start_step"]))
    if cfg.compile:
        result["compile_time_ms"] = summary.compile_time_ms
        result["compile_cache"] = cfg.compile_cache.value
        result.update(compile_mod.diagnostics())

    stages: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    artifacts: list[dict[str, Any]] = []
    if cfg.profile.enabled and distributed.rank() not in cfg.profile.ranks:
        for _ in range(cfg.profile.steps):  # the same steps as the profiled ranks: their allreduces need ours
            run_step("profile")
    elif cfg.profile.enabled:
        trainer.labelled = True  # the profiler splits steps by these ranges
        window = profiled_window(cfg, device, job_dir, label, run_step, result, summary.step_time_ms_median)
        if window is not None:
            stages, ops, artifacts = window.result.stages, window.result.ops, window.result.artifacts
            kernels = window.result.kernels
            if distributed.active():
                result["allreduce_ms_per_step"] = window.result.collective_ms
            verdict = bottleneck_verdict(
                window.result.gpu_busy_ms, summary.step_time_ms_median, summary.data_wait_fraction
            )
            result.update(verdict.row())
    if snapshot is not None:
        path = snapshot.dump()
        result["memory_snapshot_path"] = str(path)
        artifacts.append({"kind": "memory_snapshot", "path": str(path), "bytes": path.stat().st_size})

    result["steps"] = [asdict(r) for r in records]
    result["stages"], result["kernels"], result["ops"], result["artifacts"] = stages, kernels, ops, artifacts
    return result


def cpu_matmul_peak(dtype_name: str) -> float | None:
    """The CPU's matmul peak, a run's utilisation denominator, measured after its memory figures.
    Under ``job_memory_limit_mib`` a run whose training fitted can have too little left for the
    probe's matrices (up to three of 4 MiB): that is perfsweep's probe failing, not the training,
    so the run stays ok without the figure. On an H100 machine's CPU, 4 CPU tries of a batch=max
    search under 300 MiB ran out of memory on a 4 MiB allocation just after their memory step,
    where this probe runs, and were stored as oom (docs/benchmarks.md, second lease)."""
    try:
        return cpu_peak.matmul_flops(dtype_name, seconds=cpu_peak.RUN_SECONDS)
    except Exception as exc:
        if not task.is_oom(exc):
            raise
        log.warning(
            "no CPU matmul peak for this run: the probe ran out of memory after the training steps (%s)",
            first_line(str(exc), 120),
        )
        return None


def grad_scaler_figures(trainer: Trainer, measure_start_step: int) -> dict[str, Any]:
    """fp16's GradScaler: its scale after the measured steps and how many steps it skipped after
    warmup (skips in warmup are the scale calibrating; later ones mean overflowing gradients).
    Read after the measured steps, so the synchronisation they cost is outside the timings."""
    if not trainer.scaler.is_enabled():
        return {}
    drops = torch.stack(trainer.scale_drops).tolist() if trainer.scale_drops else []
    return {
        "grad_scaler_final_scale": float(trainer.scaler.get_scale()),
        "grad_scaler_skipped_steps": int(sum(drops[measure_start_step:])),
    }


def set_threads(cfg: PerfsweepConfig) -> None:
    """torch's threads: ``threads`` when set; else, when this process was given fewer cores than
    the machine has (a launcher slot, a rank's share, SLURM's allocation, a cgroup's CPU quota),
    that many (slots.default_threads), so a job does not run more threads than it may keep busy;
    else torch's default."""
    threads = cfg.threads or slots.default_threads()
    if threads:
        torch.set_num_threads(threads)


def profiled_window(
    cfg: PerfsweepConfig,
    device: torch.device,
    job_dir: Path,
    label: str,
    run_step: Callable[[str], None],
    result: dict[str, Any],
    measured_step_ms: float | None = None,
) -> ProfiledWindow | None:
    """Run the profiled steps; None, with ``result["profile_error"]`` saying why, when they ran
    out of memory. The window comes after the measured steps, and the profiler's own buffers (host
    memory under ``job_memory_limit_mib``) are what tip it over: a batch that trained its measured
    steps fits, and storing it ``oom`` made ``batch=max``'s answer depend on the profiler (52
    with it, 87 without, on the search in docs/benchmarks.md). A data-parallel job still fails:
    its other ranks are inside an allreduce that this rank would never join."""
    try:
        with ProfiledWindow(cfg.profile, device, job_dir, label, measured_step_ms) as window:
            for _ in range(window.steps_needed):
                run_step("profile")
                window.step()
        return window
    except Exception as exc:  # noqa: BLE001 - anything but an allocator failure is re-raised
        if distributed.active() or not task.is_oom(exc):
            raise
        result["profile_error"] = (
            f"not profiled: the profiled window ran out of memory after the measured steps "
            f"({type(exc).__name__}: {first_line(str(exc), 120)}); the run's figures come from the "
            "unprofiled steps. profile.record_shapes=false, profile.profile_memory=false or "
            "profile.active=1 make the profiler smaller"
        )
        log.warning("%s", result["profile_error"])
    gc.collect()  # the failed step's tensors went with the exception's frames; hand their memory back
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return None


def classify_error(exc: BaseException) -> str:
    """Map an exception to a run status: oom for allocator failures on any device, skipped for a
    predicted one (skip_predicted_oom), interrupted for Ctrl-C (the terminal's SIGINT reaches the
    job too, and with several jobs in flight its report may arrive before the sweep's), else failed."""
    if isinstance(exc, PredictedOOM):
        return "skipped"
    if isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "SignalException":
        return "interrupted"  # SignalException: torch's elastic agent (nproc) got SIGINT/SIGTERM
    return "oom" if task.is_oom(exc) else "failed"


def apply_memory_limit(cfg: PerfsweepConfig, map_probe: bool = True) -> None:
    """``job_memory_limit_mib``: cap this process's address space at its present size plus the
    limit (RLIMIT_AS), so an allocation past it fails as torch's CPU out-of-memory error. With
    ``map_probe`` (a job) the profiler that measures the job's memory maps its libraries first:
    the limit is for the job's training, not for perfsweep's own probe (memory.map_profiler).
    batch=max's prediction process reads only the limit's headroom, which that does not change."""
    if cfg.job_memory_limit_mib is None:
        return
    single_malloc_arena()
    if map_probe:
        map_profiler()
    limit_address_space(cfg.job_memory_limit_mib * 2**20)


M_ARENA_MAX = -8
"""glibc's mallopt parameter for the most malloc arenas (malloc.h)."""


def single_malloc_arena() -> None:
    """Make every thread allocate from glibc's main arena. Each thread that mallocs otherwise gets
    an arena of its own, reserving up to 64 MiB of address space that RLIMIT_AS counts though
    little of it is used; when those came and went the largest batch under a 300 MiB limit
    ranged 58-77 over four searches, and 175-179 with one arena (docs/benchmarks.md; before
    map_profiler). No effect without glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "mallopt"):
            libc.mallopt(M_ARENA_MAX, 1)
    except OSError:
        log.debug("no libc to call mallopt on: malloc arenas left as they are")


def job_free_bytes(cfg_dict: dict[str, Any]) -> tuple[str, int | None]:
    """Run in a spawned process like a job's: (device type, memory free to a job), with the job's
    memory limit applied, for batch=max's prediction (the sweeper never opens a CUDA context)."""
    cfg = to_run_config(cfg_dict)
    apply_memory_limit(cfg, map_probe=False)
    device = resolve_device(cfg.device)
    return device.type, free_bytes(device)


def rank_main(
    cfg_dict: dict[str, Any],
    token_data: TokenData | None,
    job_dir: str,
    label: str,
    launch_dir: str,
    cpus: list[int] | None,
    conn: Any,
) -> dict[str, Any] | None:
    """One rank of a data-parallel job (perfsweep.distributed.run starts them): the same training
    as a single-process job, in DDP; rank 0 reports progress and returns the run's result."""
    r = int(os.environ["RANK"])
    for sig in interrupts.HELD_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # an ignored Ctrl-C stays ignored
            signal.signal(sig, interrupts.unwind_once)
    partial: dict[str, Any] = {}
    try:
        cfg = to_run_config(cfg_dict)
        distributed.init_rank(cpus, slots.wants_cuda(cfg.device))
        progress = Reporter(conn) if r == 0 and conn is not None else None
        result = train(cfg, token_data, distributed.rank_folder(job_dir, r), label, launch_dir, progress, partial)
        return result if r == 0 else None
    except BaseException as exc:
        message = task.error_text(exc)
        distributed.write_failure(job_dir, r, classify_error(exc), message, traceback.format_exc(limit=8), partial)
        raise
    finally:
        if distributed.active():
            torch.distributed.destroy_process_group()


def job_main(
    cfg_dict: dict[str, Any],
    token_data: TokenData | None,
    job_dir: str,
    label: str,
    launch_dir: str,
    conn: Any,
    cpus: list[int] | None = None,
    start_method: str | None = None,
) -> None:
    """The spawned job process's work, after perfsweep.job_entry has sent its stdout/stderr (C++
    warnings, the profiler's start/stop lines) to ``job.log``; every outcome goes back through
    ``conn``. ``cpus``: its launcher slot's cores (perfsweep.slots), pinned here; its GPUs came in
    its environment. ``start_method``: how this process started, for the run's row.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if cpus:
        os.sched_setaffinity(0, cpus)
    # SLURM signals every process of the job step; the launching process decides what a signal
    # means for the run (perfsweep.launcher.scheduler_signals), and stops this one itself.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # not under nohup
        signal.signal(signal.SIGHUP, interrupts.unwind_on_hangup)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started where Ctrl-C is ignored (a script's `&`; perfsweep.interrupts.held keeps it so):
        # the sweep stops this job with SIGTERM instead (launcher._stop), which must then unwind
        # it as Ctrl-C does, its DataLoader workers shut down. Killed outright, they were left
        # running and the resource tracker warned of leaked semaphores.
        signal.signal(signal.SIGTERM, interrupts.raise_terminated)
    conn.send(("ready", time.monotonic()))  # interpreter and imports are up: the job's timeout clock starts now
    progress = Reporter(conn)
    partial: dict[str, Any] = {"start_method": start_method}
    try:
        cfg = to_run_config(cfg_dict)
        apply_memory_limit(cfg)
        if cfg.nproc is not None:
            ddp = distributed.run(rank_main, cfg, token_data, Path(job_dir), label, launch_dir, conn)
            conn.send(("result", {**ddp, "start_method": start_method}))
        else:
            conn.send(("result", train(cfg, token_data, Path(job_dir), label, launch_dir, progress, partial)))
    except distributed.RankFailed as exc:  # a rank's own outcome, classified in that rank
        conn.send(("error", exc.status, str(exc), exc.tb, exc.partial))
    except BaseException as exc:  # noqa: BLE001 - every failure is a result
        if isinstance(exc, PredictedOOM):  # a decision, not a crash: no traceback
            conn.send(("error", "skipped", str(exc), "", partial))
        elif (status := classify_error(exc)) == "interrupted":  # Ctrl-C: what stopped it, not where
            what = f"{type(exc).__name__}: {exc}" if str(exc) else interrupts.signal_name(exc)  # a rank's signal
            conn.send(("error", status, f"interrupted ({what})", "", partial))  # the launcher adds what to do
        else:
            tb = traceback.format_exc(limit=8)
            conn.send(("error", status, task.error_text(exc), tb, partial))
    finally:
        conn.close()
