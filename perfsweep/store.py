"""The result database: the one place where perfsweep's tables are declared and written.

``runs`` is deliberately wide: every grid axis, the environment and every summary figure is
a real column, so the common question needs no join. Detail (per-step times, profiler stage
and operator tables, artifacts) lives in child tables keyed by ``run_id``.

The schema is managed by Alembic (``perfsweep/migrations``); :func:`connect` upgrades an
older database in place and never drops a table or a row. A job's results are written in a
single short transaction, so a crash between jobs cannot leave half a run behind.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import shlex
import socket
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    TypeDecorator,
    create_engine,
    event,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from perfsweep.cli import UserError, first_line, hide_password, hide_password_in_word, user_cache_dir
from perfsweep.names import FINAL_STATUSES, HEARTBEAT_STALE_S, RERUN_HINTS, is_multirun

log = logging.getLogger(__name__)
# before any import of Alembic: its plugins say INFO lines as they load, its context as it migrates
logging.getLogger("alembic").setLevel(logging.WARNING)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend; SQLite alone would drop the offset."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ARG002
        if value is not None:
            value = (value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value).astimezone(timezone.utc)
        return value

    def process_result_value(self, value, dialect):  # noqa: ARG002
        if value is not None:
            value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
        return value


class Real(TypeDecorator):
    """A float column whose NaN is stored as NULL on every backend.

    SQLite has no NaN and stores it as NULL, PostgreSQL keeps it: the same run read differently
    (``WHERE final_loss IS NULL``, an audit that skips a missing loss but flags a NaN one)
    depending on where it was stored. NULL everywhere; infinities are stored as they are (both
    keep them). What a NaN meant is kept beside it where it matters (``nonfinite_loss_steps``).
    """

    impl = Float
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ARG002
        return None if value is not None and value != value else value  # NaN is the one value unequal to itself


def json_safe(value: Any) -> Any:
    """``value`` with every infinite or NaN float in it as the string ``float()`` reads back."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(float(value))  # 'inf', '-inf', 'nan': what float() reads back (repr of numpy's: np.float64(inf))
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class PortableJSON(TypeDecorator):
    """JSON that every backend takes and every JSON reader parses.

    Python writes an infinite or NaN float as the bare word ``Infinity`` or ``NaN``, which is not
    JSON: PostgreSQL refused the whole row (a run with a factory argument ``max_norm=inf`` was
    not stored) and SQLite's ``json_extract`` called the text malformed. Such a float is stored
    as the string ``"inf"``, ``"-inf"`` or ``"nan"`` instead, which ``float()`` reads back.
    """

    impl = JSON
    cache_ok = True
    should_evaluate_none = True  # as JSON has it: a run's unset column stays SQL NULL (a TypeDecorator wrote 'null')

    def process_bind_param(self, value, dialect):  # noqa: ARG002
        return json_safe(value)

    def process_result_value(self, value, dialect):  # noqa: ARG002
        return json_safe(value)  # a row stored before (SQLite kept Infinity) reads as the rows stored now


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: PortableJSON, int: BigInteger}


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    sweep_dir: Mapped[str] = mapped_column(String(1000), unique=True)
    command: Mapped[str | None] = mapped_column(Text)
    n_jobs: Mapped[int | None] = mapped_column(Integer)
    hostname: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # lifecycle (names.SWEEP_STATUSES): running from the first write until the summary, or
    # interrupted when its process is found gone; launch_dir and command let `resume` rerun it
    status: Mapped[str | None] = mapped_column(String(16))
    launch_dir: Mapped[str | None] = mapped_column(String(1000))
    pid: Mapped[int | None] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # CPU sweeps: the machine's achievable matmul FLOP/s, measured once before the jobs with the
    # jobs' thread count (perfsweep.cpu_peak); with runs.cpu_matmul_flops, the denominator of
    # runs.cpu_flops_utilisation (the best of them)
    cpu_matmul_fp32_flops: Mapped[float | None] = mapped_column(Real)
    cpu_matmul_bf16_flops: Mapped[float | None] = mapped_column(Real)
    cpu_matmul_threads: Mapped[int | None] = mapped_column(Integer)
    """torch threads the peaks were measured with; only runs with as many are set against them."""
    parallel: Mapped[int | None] = mapped_column(Integer)
    """Jobs run at once by perfsweep's launcher (``launcher.parallel``, as slots allowed); above 1
    the jobs shared memory bandwidth, PCIe and the host, and the summary says so."""
    hydra_launcher: Mapped[str | None] = mapped_column(String(100))
    """Hydra's launcher class that ran the jobs: BasicLauncher (local), SlurmLauncher, JoblibLauncher..."""

    runs: Mapped[list[Run]] = relationship(back_populates="sweep")


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id"), index=True)
    job_num: Mapped[int | None] = mapped_column(Integer)
    overrides: Mapped[str | None] = mapped_column(Text)
    # grid axes: one real column each
    amp: Mapped[bool] = mapped_column(Boolean)
    ckpt: Mapped[bool] = mapped_column(Boolean)
    batch: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int | None] = mapped_column(Integer)
    """Null for a model whose unit is samples (model.unit=samples: images have no sequence length)."""
    compile: Mapped[bool] = mapped_column(Boolean)
    workers: Mapped[int] = mapped_column(Integer)
    amp_dtype: Mapped[str] = mapped_column(String(8))
    model_name: Mapped[str] = mapped_column(String(100))
    data_name: Mapped[str] = mapped_column(String(100))
    config_json: Mapped[dict[str, Any]] = mapped_column(PortableJSON)
    config_hash: Mapped[str] = mapped_column(String(64), index=True)
    # outcome
    status: Mapped[str] = mapped_column(String(16), index=True)
    """One of names.RUN_STATUSES."""
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    duration_s: Mapped[float | None] = mapped_column(Real)
    """From the job's start to its outcome, in the sweep's process: the data's preparation, the
    job's process and all it ran (the three columns below split what was not steps)."""
    process_start_ms: Mapped[float | None] = mapped_column(Real)
    """metrics.JobPhases: the job's process started and its imports done (null before schema 0017)."""
    setup_ms: Mapped[float | None] = mapped_column(Real)
    """metrics.JobPhases: from then to the first step's start (device, model, optimizer, data)."""
    after_steps_ms: Mapped[float | None] = mapped_column(Real)
    """metrics.JobPhases: from the measured window's end to the result (probes, profiled window)."""
    job_dir: Mapped[str | None] = mapped_column(String(1000))
    run_uid: Mapped[str | None] = mapped_column(String(32), unique=True, index=True)
    """Random id given when the job starts; `perfsweep import` uses it to store a result once."""
    pid: Mapped[int | None] = mapped_column(Integer)
    """The launching process that watches the job (on ``hostname``), for finding dead jobs."""
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    """Database clock, stamped every names.HEARTBEAT_INTERVAL_S while the job runs."""
    # environment
    hostname: Mapped[str | None] = mapped_column(String(255))
    device_type: Mapped[str | None] = mapped_column(String(16))
    device_name: Mapped[str | None] = mapped_column(String(255))
    cpu_model: Mapped[str | None] = mapped_column(String(255))
    cpu_count: Mapped[int | None] = mapped_column(Integer)
    """The machine's logical CPUs (os.cpu_count); what the job could use is cpus_allotted."""
    cpu_affinity: Mapped[str | None] = mapped_column(String(255))
    """The cores the job process could run on (its affinity mask, e.g. ``0-3``): its launcher slot,
    its SLURM allocation where SLURM binds tasks, or the whole machine."""
    cpus_allotted: Mapped[int | None] = mapped_column(Integer)
    """CPUs the job was given: the affinity mask's size, or SLURM_CPUS_PER_TASK or the cgroup's CPU
    quota in whole CPUs (a container's ``--cpus``) where smaller."""
    cuda_visible_devices: Mapped[str | None] = mapped_column(String(255))
    """CUDA_VISIBLE_DEVICES as the job saw it (its launcher slot's GPUs); null when unset."""
    start_method: Mapped[str | None] = mapped_column(String(16))
    """How the job's process started (launcher.start_method): ``spawn``, a new interpreter that
    imported torch itself, or ``forkserver``, forked from a process that imported torch once for
    the sweep and ran nothing. Null: the job never reported (or the row predates schema 0016)."""
    slurm_job_id: Mapped[str | None] = mapped_column(String(32))
    """SLURM_JOB_ID of the allocation the job ran in (array jobs: SLURM_ARRAY_JOB_ID_TASK)."""
    torch_threads: Mapped[int | None] = mapped_column(Integer)
    torch_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(32))
    cudnn_version: Mapped[str | None] = mapped_column(String(16))
    gpu_driver_version: Mapped[str | None] = mapped_column(String(32))
    gpu_total_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    gpu_compute_capability: Mapped[str | None] = mapped_column(String(8))
    tf32_matmul: Mapped[bool | None] = mapped_column(Boolean)
    """TF32 for float32 matmuls (torch.backends.cuda.matmul.allow_tf32 or its env override)."""
    tf32_cudnn: Mapped[bool | None] = mapped_column(Boolean)
    cudnn_benchmark: Mapped[bool | None] = mapped_column(Boolean)
    cuda_alloc_conf: Mapped[str | None] = mapped_column(String(255))
    """PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) as the job saw it."""
    python_version: Mapped[str | None] = mapped_column(String(32))
    git_commit: Mapped[str | None] = mapped_column(String(64))
    """HEAD of the launch directory's checkout (rows before schema 0005 append -dirty)."""
    git_dirty: Mapped[bool | None] = mapped_column(Boolean)
    """Tracked files differed from HEAD when the job ran."""
    # model and data
    n_params: Mapped[int | None] = mapped_column(BigInteger)
    n_params_non_embedding: Mapped[int | None] = mapped_column(BigInteger)
    vocab_size: Mapped[int | None] = mapped_column(Integer)
    vocab_size_padded: Mapped[int | None] = mapped_column(Integer)
    unk_token_share: Mapped[float | None] = mapped_column(Real)
    optimizer_fused: Mapped[bool | None] = mapped_column(Boolean)
    # timing (measured steps only; warmup excluded)
    repeat_index: Mapped[int | None] = mapped_column(Integer)
    grid_index: Mapped[int | None] = mapped_column(Integer)
    """The run's grid point in the grid's own order (job_num is its place in the run order)."""
    batch_search_id: Mapped[int | None] = mapped_column(ForeignKey("batch_searches.id"), index=True)
    """The ``batch=max`` search this run was a try of (its oom tries included); null otherwise."""
    """Which repeat of its config this run is (0-based; ``repeat=N``); repeats share config_hash."""
    warmup_steps: Mapped[int | None] = mapped_column(Integer)
    """Warmup steps actually run: at least steps.warmup, more until the step time was steady."""
    measure_start_step: Mapped[int | None] = mapped_column(Integer)
    """Index (0-based, as in ``steps.step``) of the first measured step."""
    steady_state: Mapped[bool | None] = mapped_column(Boolean)
    """Whether warmup ended on the steady-state rule (false: it hit steps.max_warmup or
    steps.max_warmup_s unsettled; null: the check was off, or the run predates it)."""
    timing_mode: Mapped[str | None] = mapped_column(String(8))
    """sync (host clock, device synchronised each step) or events (CUDA events, one sync)."""
    measure_steps: Mapped[int | None] = mapped_column(Integer)
    first_step_ms: Mapped[float | None] = mapped_column(Real)
    step_time_ms_median: Mapped[float | None] = mapped_column(Real)
    step_time_ms_p10: Mapped[float | None] = mapped_column(Real)
    step_time_ms_p90: Mapped[float | None] = mapped_column(Real)
    step_time_ms_mean: Mapped[float | None] = mapped_column(Real)
    step_time_ms_std: Mapped[float | None] = mapped_column(Real)
    step_time_ms_iqr: Mapped[float | None] = mapped_column(Real)
    step_time_cv: Mapped[float | None] = mapped_column(Real)
    noisy: Mapped[bool | None] = mapped_column(Boolean)
    """Step times too spread to tell small differences apart, by noisy_rule (metrics.noisy_steps)."""
    noisy_rule: Mapped[str | None] = mapped_column(String(200))
    """names.NOISY_RULE when the run was judged; rows before schema 0012: the IQR rule alone."""
    measure_wall_ms: Mapped[float | None] = mapped_column(Real)
    """Wall time of the measured window; tokens_per_s is the window's tokens over it."""
    data_wait_ms_median: Mapped[float | None] = mapped_column(Real)
    data_wait_fraction: Mapped[float | None] = mapped_column(Real)
    data_bound: Mapped[bool | None] = mapped_column(Boolean)
    """data_wait_fraction above names.DATA_BOUND_WAIT_FRACTION: the loader, not the model, sets the pace."""
    tokens_per_s: Mapped[float | None] = mapped_column(Real)
    """All ranks together for a data-parallel job (global batch over the slowest rank's steps)."""
    samples_per_s: Mapped[float | None] = mapped_column(Real)
    # data-parallel jobs (nproc set): step times are the slowest rank's at each step
    nproc: Mapped[int | None] = mapped_column(Integer)
    """Ranks of a DistributedDataParallel job; null: a plain single process without DDP."""
    global_batch: Mapped[int | None] = mapped_column(Integer)
    """Samples per optimizer step over all ranks: nproc x batch."""
    tokens_per_s_per_rank: Mapped[float | None] = mapped_column(Real)
    samples_per_s_per_rank: Mapped[float | None] = mapped_column(Real)
    slowest_rank: Mapped[int | None] = mapped_column(Integer)
    """The rank with the largest median step time (the one the others wait for in allreduce)."""
    slowest_rank_step_time_ms_median: Mapped[float | None] = mapped_column(Real)
    """That rank's own median step time (step_time_ms_median is the median over steps of the
    slowest rank at each step)."""
    allreduce_ms_per_step: Mapped[float | None] = mapped_column(Real)
    """Gradient allreduce time per profiled step on rank 0, from its trace: NCCL's communication
    kernels on CUDA, gloo's collective ranges on CPU; null for a single-process job."""
    final_loss: Mapped[float | None] = mapped_column(Real)
    """Loss of the last measured step; null where it was NaN (see nonfinite_loss_steps)."""
    nonfinite_loss_steps: Mapped[int | None] = mapped_column(Integer)
    """Measured steps whose loss was NaN or infinite (0 for a training that works); such a run
    gets numerics_warning. Null where not counted: a run not ok, or one stored before schema 0013
    without its steps."""
    flops_per_token: Mapped[float | None] = mapped_column(Real)
    """Training FLOPs per token (forward + backward, no recomputation); null for a samples model."""
    flops_per_sample: Mapped[float | None] = mapped_column(Real)
    """Training FLOPs per sample (a sequence, an image): what model_tflops_per_s and MFU use."""
    flops_method: Mapped[str | None] = mapped_column(String(16))
    """formula (the model's flops_per_token, like perfsweep's GPT) or flop_counter (torch's
    FlopCounterMode over one meta-device step); null where neither could count: MFU null."""
    model_tflops_per_s: Mapped[float | None] = mapped_column(Real)
    mfu: Mapped[float | None] = mapped_column(Real)
    cpu_flops_utilisation: Mapped[float | None] = mapped_column(Real)
    """CPU runs: model FLOP/s over the best matmul rate measured in the run's compute dtype and thread
    count, the sweep's (sweeps.cpu_matmul_*_flops) or any of its runs' (cpu_matmul_flops), not a
    published peak: one denominator for those runs (perfsweep.summary.fill_cpu_utilisation)."""
    cpu_matmul_flops: Mapped[float | None] = mapped_column(Real)
    """CPU runs: the best matmul FLOP/s in the run's compute dtype, measured by the job right after
    its measured steps with its threads (perfsweep.cpu_peak). Load on the machine while the sweep
    measured its own peak lowered that one, and utilisation read above 1; this one sees the load
    the steps saw."""
    # speedup against the sweep's baseline config, written at the end of the sweep
    speedup: Mapped[float | None] = mapped_column(Real)
    """tokens/s of this run's config over the baseline config's (medians over repeats or steps)."""
    speedup_ci_lo: Mapped[float | None] = mapped_column(Real)
    speedup_ci_hi: Mapped[float | None] = mapped_column(Real)
    """95% bootstrap interval of ``speedup`` (see speedup_basis)."""
    speedup_basis: Mapped[str | None] = mapped_column(String(16))
    """repeats (resampled runs, N > 1) or steps (resampled measured steps, in blocks)."""
    speedup_verdict: Mapped[str | None] = mapped_column(String(32))
    """faster, slower, no measurable difference (the interval contains 1) or baseline."""
    baseline_config_hash: Mapped[str | None] = mapped_column(String(64))
    """model_tflops_per_s over mfu_peak_flops (CUDA devices in envinfo.PEAK_FLOPS; else null)."""
    mfu_peak_flops: Mapped[float | None] = mapped_column(Real)
    """The dense peak FLOP/s the MFU was taken against: the device's, in mfu_compute_dtype."""
    mfu_compute_dtype: Mapped[str | None] = mapped_column(String(8))
    """fp32, tf32, bf16 or fp16: what the run's matmuls executed in (autocast dtype or torch's TF32 setting)."""
    # bottleneck verdict (CUDA only; null on CPU, never guessed): see perfsweep.metrics.bottleneck
    gpu_busy_ms: Mapped[float | None] = mapped_column(Real)
    gpu_busy_fraction: Mapped[float | None] = mapped_column(Real)
    bottleneck: Mapped[str | None] = mapped_column(String(8), index=True)
    bottleneck_rule: Mapped[str | None] = mapped_column(String(200))
    profile_error: Mapped[str | None] = mapped_column(Text)
    """Why an ``ok`` run has no stages, kernels or ops: its profiled window, which runs after the
    measured steps, ran out of memory (the profiler's own buffers). The run's figures stand: they
    come from the unprofiled steps. Null when the window ran, or was not asked for."""
    # memory (measured window; see runner.memory for how each is taken)
    peak_mem_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_active_bytes: Mapped[int | None] = mapped_column(BigInteger)
    rss_before_train_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    rss_growth_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_limit_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    """CPU with ``job_memory_limit_mib``: the job's address-space peak above its size when the limit
    was set, up to the profiled window (memory.limit_used_bytes); null without a limit."""
    num_alloc_retries: Mapped[int | None] = mapped_column(Integer)
    num_ooms: Mapped[int | None] = mapped_column(Integer)
    memory_snapshot_path: Mapped[str | None] = mapped_column(String(1000))
    # memory ledger: predicted before the job trained (perfsweep.ledger; perfsweep's GPT only),
    # bytes live at the predicted peak by category; they add up to predicted_peak_bytes
    predicted_params_bytes: Mapped[int | None] = mapped_column(BigInteger)
    predicted_grads_bytes: Mapped[int | None] = mapped_column(BigInteger)
    predicted_optimizer_bytes: Mapped[int | None] = mapped_column(BigInteger)
    predicted_activations_bytes: Mapped[int | None] = mapped_column(BigInteger)
    """Saved activations, autocast's weight copies and checkpointed block inputs."""
    predicted_logits_bytes: Mapped[int | None] = mapped_column(BigInteger)
    predicted_slack_bytes: Mapped[int | None] = mapped_column(BigInteger)
    """CUDA caching allocator's reserved-but-unused share (not in predicted_peak_bytes)."""
    predicted_peak_bytes: Mapped[int | None] = mapped_column(BigInteger)
    """Predicted peak_allocated_bytes."""
    predicted_peak_phase: Mapped[str | None] = mapped_column(String(16))
    """backward_start or backward_end: the moment the ledger puts the peak at."""
    predicted_peak_error: Mapped[float | None] = mapped_column(Real)
    """predicted_peak_bytes / peak_allocated_bytes - 1 (negative: the ledger predicted too little)."""
    # numerics: fp16's GradScaler and the loss against the sweep's FP32-eager twin (perfsweep.audit)
    grad_scaler_final_scale: Mapped[float | None] = mapped_column(Real)
    grad_scaler_skipped_steps: Mapped[int | None] = mapped_column(Integer)
    """Optimizer steps GradScaler skipped for inf/NaN gradients (fp16 only)."""
    numerics_twin_run_id: Mapped[int | None] = mapped_column(Integer)
    """The run this one's losses were compared with: same sweep, settings, seed and steps, with
    amp, ckpt and compile off."""
    loss_max_rel_diff: Mapped[float | None] = mapped_column(Real)
    """Largest |loss - twin loss| / |twin loss| over the steps both ran."""
    numerics_diverged_step: Mapped[int | None] = mapped_column(Integer)
    """First step whose loss left the tolerance (names.LOSS_TOLERANCE); null when none did."""
    numerics_warning: Mapped[bool | None] = mapped_column(Boolean)
    """A step left the tolerance, a GradScaler skipped steps after warmup, or a measured step's
    loss was NaN or infinite."""
    # torch.compile
    compile_time_ms: Mapped[float | None] = mapped_column(Real)
    compile_payback_steps: Mapped[float | None] = mapped_column(Real)
    n_graphs: Mapped[int | None] = mapped_column(Integer)
    n_graph_breaks: Mapped[int | None] = mapped_column(Integer)
    n_recompiles: Mapped[int | None] = mapped_column(Integer)
    graph_break_reasons: Mapped[dict[str, Any] | None] = mapped_column(PortableJSON)
    compile_cache: Mapped[str | None] = mapped_column(String(16))
    compile_cache_hits: Mapped[int | None] = mapped_column(Integer)

    sweep: Mapped[Sweep] = relationship(back_populates="runs")
    steps: Mapped[list[Step]] = relationship(cascade="all, delete-orphan")
    stages: Mapped[list[Stage]] = relationship(cascade="all, delete-orphan")
    kernels: Mapped[list[Kernel]] = relationship(cascade="all, delete-orphan")
    ops: Mapped[list[Op]] = relationship(cascade="all, delete-orphan")
    artifacts: Mapped[list[Artifact]] = relationship(cascade="all, delete-orphan")


class BatchSearch(Base):
    """One ``batch=max`` grid point: the largest batch that trained, found by real jobs (their
    rows point here through ``runs.batch_search_id``), with the figures of the run at that batch
    copied in so the common question needs no join."""

    __tablename__ = "batch_searches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id"), index=True)
    grid_index: Mapped[int | None] = mapped_column(Integer)
    overrides: Mapped[str | None] = mapped_column(Text)
    """The grid point's overrides (``batch=max`` among them)."""
    seq_len: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    """running, done (max_batch found), none_fit (batch 1 ran out of memory), failed (a try ended
    other than ok or oom: see error) or interrupted."""
    error: Mapped[str | None] = mapped_column(Text)
    free_bytes: Mapped[int | None] = mapped_column(BigInteger)
    """Device memory free to a job when the search began (what the prediction was held against)."""
    predicted_max_batch: Mapped[int | None] = mapped_column(Integer)
    """The ledger's largest fitting batch, where the search started (null: no ledger; it starts at 1)."""
    calibrated_max_batch: Mapped[int | None] = mapped_column(Integer)
    """The largest fitting batch by the first ok try's measured memory use (search.Calibration),
    tried next; null where the device gives nothing to calibrate with (a CPU without
    job_memory_limit_mib) or no try trained."""
    max_batch: Mapped[int | None] = mapped_column(Integer)
    """The largest batch that trained ok."""
    first_oom_batch: Mapped[int | None] = mapped_column(Integer)
    """The smallest batch that ran out of memory: max_batch + 1 when the search finished."""
    capped: Mapped[bool | None] = mapped_column(Boolean)
    """max_batch reached max_batch_cap without an oom: the true maximum may be larger."""
    n_tried: Mapped[int | None] = mapped_column(Integer)
    best_run_id: Mapped[int | None] = mapped_column(Integer)
    """The ok run at max_batch."""
    tokens_per_s: Mapped[float | None] = mapped_column(Real)
    samples_per_s: Mapped[float | None] = mapped_column(Real)
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Step(Base):
    """Every optimizer step of a job, warmup included (phase says which) so nothing is hidden."""

    __tablename__ = "steps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(16))  # warmup | measure
    step_time_ms: Mapped[float] = mapped_column(Real)
    data_wait_ms: Mapped[float] = mapped_column(Real)
    loss: Mapped[float | None] = mapped_column(Real)
    """Null where the loss was NaN (every step has one otherwise)."""


class Stage(Base):
    """Per-step time of each annotated stage, averaged over the profiler's active steps."""

    __tablename__ = "stages"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    stage: Mapped[str] = mapped_column(String(64))
    cpu_time_ms: Mapped[float] = mapped_column(Real)
    device_time_ms: Mapped[float | None] = mapped_column(Real)
    device_time_source: Mapped[str] = mapped_column(String(32))
    calls: Mapped[int] = mapped_column(Integer)


class Kernel(Base):
    """GPU time per profiled step by kernel category (rules in perfsweep.trace.KERNEL_RULES)."""

    __tablename__ = "kernels"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    category: Mapped[str] = mapped_column(String(32))
    ms_per_step: Mapped[float] = mapped_column(Real)
    kernels_per_step: Mapped[float] = mapped_column(Real)


class Op(Base):
    """Top operators from the profiler's key_averages, per sort key.

    Times and ``*_per_step`` are per profiled step; ``calls`` and ``flops`` are totals over the
    profiled window's ``profile.active`` steps.
    """

    __tablename__ = "ops"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    sort_by: Mapped[str] = mapped_column(String(32))  # self_device | self_cpu
    rank: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(Text)
    calls: Mapped[int] = mapped_column(Integer)
    self_cpu_ms: Mapped[float] = mapped_column(Real)
    self_device_ms: Mapped[float | None] = mapped_column(Real)
    cpu_total_ms: Mapped[float] = mapped_column(Real)
    device_total_ms: Mapped[float | None] = mapped_column(Real)
    flops: Mapped[int | None] = mapped_column(BigInteger)
    calls_per_step: Mapped[float | None] = mapped_column(Real)
    flops_per_step: Mapped[float | None] = mapped_column(Real)


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # trace | profiler_table | memory_snapshot | ...
    path: Mapped[str] = mapped_column(String(1000))
    bytes: Mapped[int] = mapped_column(BigInteger)


# ---------------------------------------------------------------------------------------------

_migrate_lock = threading.Lock()


DEFAULT_DB_ARG = "sqlite:///./results.db"
"""``--db`` of the commands that read or import: results.db in the current directory."""


@functools.cache
def _decodes_database() -> bool:
    """Whether this SQLAlchemy decodes ``%XX`` in a URL's database part: 2.1 does; 2.0 (what
    Python 3.10 installs) opens it as written (sqlalchemy/sqlalchemy#11234)."""
    return make_url("sqlite:///%41").database == "A"


def sqlite_url(path: str | Path) -> str:
    """The ``sqlite:///`` URL of the file at ``path``. SQLAlchemy 2.1 reads a URL as a URL: ``%41``
    in it is ``A`` and ``?`` starts its options, so a file named ``pct%41.db`` given as a path was
    written as ``pctA.db``; those two characters are escaped. SQLAlchemy 2.0 opens the path as
    written (escaped, ``pct%2541.db`` was written) but still ends it at a ``?``: such a path is a
    UserError there, where it wrote to the file named by the part before it."""
    if _decodes_database():
        return "sqlite:///" + str(path).replace("%", "%25").replace("?", "%3F")
    if "?" in str(path):
        import sqlalchemy

        raise UserError(
            f"{path}: SQLAlchemy {sqlalchemy.__version__} cannot open a SQLite file whose path holds a '?' "
            "(it reads the rest as options; 2.1 or later can): rename it, or upgrade SQLAlchemy"
        )
    return "sqlite:///" + str(path)


def default_url(launch_dir: str | Path) -> str:
    """Where a sweep writes when ``db.url`` is not set: results.db in the launch directory."""
    return sqlite_url(Path(launch_dir).resolve() / "results.db")


def url_from_arg(db: str) -> str:
    """A SQLAlchemy URL from ``--db``: URLs pass through, plain paths become sqlite URLs. Empty, or
    an in-memory database (which holds nothing here and keeps nothing written), is a UserError: an
    import into ``sqlite://`` said "2 imported" of results gone at its exit, and ``--db ""`` was
    ./results.db."""
    if not db.strip():
        raise UserError("--db is empty: give a SQLite file or a database URL")
    if in_memory(db):
        raise UserError(
            f"--db {db}: an in-memory database holds no results and keeps none; give a SQLite file or a server URL"
        )
    if db.startswith("sqlite:///"):
        path = db.removeprefix("sqlite:///")
        if path and path != ":memory:" and not Path(path).is_absolute():
            return f"sqlite:///{Path(path).resolve()}"  # report.md then says where the file is
        return db
    if "://" in db:
        return db
    return sqlite_url(Path(db).expanduser().resolve())


_SQLITE_PERMISSION_ERRORS = ("readonly", "read-only", "unable to open database file")


def write_hint(url: str, exc: BaseException) -> str:
    """``"; a SQLite file and its folder must be writable"`` when ``exc`` is SQLite refusing a
    write for want of permission (the file, or the folder where it keeps its journal), else "".
    SQLite's own words ("unable to open database file") do not say that a folder is the cause."""
    if url.startswith("sqlite") and any(e in str(exc).lower() for e in _SQLITE_PERMISSION_ERRORS):
        if (path := sqlite_file(url)) is not None and path.is_dir():  # SQLite's words are the same
            return (
                f"; {path} is a folder, not a database file: name a file in it, e.g. {sqlite_url(path / 'results.db')}"
            )
        return "; a SQLite file and its folder must be writable"
    return ""


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (its query string, e.g. ``?timeout=5``, left out); None for
    another database."""
    if not url.startswith("sqlite:///"):
        return None
    try:
        return Path(make_url(url).database or "")  # as SQLAlchemy opens it: %XX decoded, options left out
    except (ArgumentError, ValueError):
        return Path(url.removeprefix("sqlite:///").split("?")[0])


def in_memory(url: str) -> bool:
    """Whether ``url`` names an in-memory SQLite database, however spelled (``sqlite://``,
    ``sqlite+pysqlite://``, ``sqlite://?cache=shared``, ``:memory:``): it dies with the process."""
    if ":memory:" in url or "mode=memory" in url:
        return True
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return False
    return parsed.get_backend_name() == "sqlite" and not parsed.database


def typed_command() -> str:
    """``sweeps.command``: this process's command line as a user would type it again, a db.url's
    password as ``***`` (:func:`hide_password`). ``perfsweep resume`` takes the database from its
    own ``--db``, so the stored command needs no password, and a results database is no place to
    keep the password to itself: every reader of the results could read it there."""
    return shlex.join(["perfsweep", *map(hide_password_in_word, sys.argv[1:])])


def existing_url(db: str) -> str:
    """:func:`url_from_arg` of ``db``; a missing SQLite file is an error, not a new empty file."""
    url = url_from_arg(db)
    if (path := sqlite_file(url)) is not None and str(path) != ":memory:" and not path.is_file():
        what = (
            "is a folder, not a database file" if path.is_dir() else "is not a regular file" if path.exists() else None
        )
        raise UserError(f"--db {hide_password(db)}: {what or f'database file not found ({path})'}")
    if path is not None and not is_sqlite_file(path):  # a query touching no table read a text file as empty
        raise UserError(f"--db {hide_password(db)}: is not a SQLite database file (its first bytes are not SQLite's)")
    return url


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file (an empty file is an empty database too)."""


def is_sqlite_file(path: Path) -> bool:
    """Whether ``path`` is an empty file or starts as a SQLite database does; True where it cannot
    be read, for SQLite's own answer then to say why."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError:
        return True
    return head in (b"", SQLITE_HEADER)


def _writable(url: str) -> bool:
    """Whether an upgrade could write the SQLite file at ``url`` (and its folder, for the journal);
    True for a server, whose permissions are its own to say."""
    if (path := sqlite_file(url)) is None:
        return True
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def older_schema(revision: str, url: str, db: str) -> str:
    """What to say of a database at an older ``revision`` than this perfsweep's head (``db``: as
    the user gave it, its password hidden): the command that upgrades it, or a copy of it."""
    return (
        f"schema revision {revision} is older than this perfsweep's {head_revision()}; "
        f"upgrade it first with: perfsweep upgrade --db {db}"
        + ("" if _writable(url) else " (the file is read-only here: upgrade a copy)")
    )


def open_existing(db: str) -> Engine:
    """Open an existing database read-only; a missing SQLite file is an error, not a new empty file.

    A report never writes, so it works on read-only media. A database whose schema is older than
    this perfsweep is not upgraded behind the user's back: the error names the command that does.
    """
    url, db = existing_url(db), hide_password(db)
    try:
        refuse_damage(url)
        engine = connect_read_only(url)
        revision = schema_revision(engine)
    except DamagedDatabase as exc:
        raise DamagedDatabase(f"--db {db}: {exc}") from None
    except Exception as exc:  # driver missing, server unreachable, not a database...
        raise UserError(f"--db {db}: cannot open the database ({first_line(exc)})") from exc
    head = head_revision()
    if revision != head:
        engine.dispose()
        if revision is None:
            raise UserError(f"--db {db}: not a perfsweep results database (no schema version)")
        if why := unknown_revision(revision, url):
            raise UserError(f"--db {db}: {why}")
        raise UserError(f"--db {db}: {older_schema(revision, url, db)}")
    try:  # a report read its tables as they came and failed halfway
        refuse_damage(url, engine)
    except DamagedDatabase as exc:
        raise DamagedDatabase(f"--db {db}: {exc}") from None
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # Let SQLAlchemy's BEGIN (below) govern transactions: the sqlite3 driver would otherwise run
    # DDL outside them, and a job killed mid-migration would leave tables without a version row.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    if cur.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        # WAL is written into the file: only into a new one or perfsweep's, so that a file of
        # another application's, which upgrade() then refuses, is left exactly as it was
        tables = {r[0] for r in cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables or {"alembic_version", "sweeps"} <= tables:
            cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite statement waits for another process's lock before "database is locked"."""

SQLITE_BEGIN_SLICE_MS = 100
"""The slices :func:`_sqlite_begin` waits for the write lock in."""


def _sqlite_begin(conn) -> None:
    """Every transaction on a SQLite file begins IMMEDIATE: it takes the write lock at the start,
    waiting for other writers. A deferred BEGIN that reads and then writes (save_run,
    mark_interrupted) fails at once with "database is locked" when another process wrote in
    between: WAL cannot upgrade a stale read snapshot, and SQLite does not wait in that case.

    The wait is :data:`SQLITE_BUSY_TIMEOUT_MS` in all, taken in slices of
    :data:`SQLITE_BEGIN_SLICE_MS`: SQLite waits inside its C code, where Python's signal handlers
    cannot run (nor does ``interrupt()`` end that wait), so a Ctrl-C at a sweep's "still waiting
    for the database" took 27 s to stop it. Between slices the handlers run, and a stop comes
    within one slice."""
    raw = conn.connection.dbapi_connection
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    raw.execute(f"PRAGMA busy_timeout={SQLITE_BEGIN_SLICE_MS}")
    try:
        while time.monotonic() < deadline:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                # SQLITE_BUSY alone: SQLITE_LOCKED ("database table is locked", a shared cache)
                # comes at once, without the busy wait, and retrying it spun a core for 30 s
                if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY and str(exc) != "database is locked":
                    break
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # the last try through SQLAlchemy: its error wrapped as any other
    finally:
        raw.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL mode and a busy timeout for concurrent jobs."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
    else:
        # PGOPTIONS applies as it is where the URL gives none
        options = pg_options(url, with_env=False) if url.startswith("postgresql") else ""
        extra = {"connect_args": {"options": options}} if options else {}
        engine = stoppable(create_engine(installed_driver(url), pool_pre_ping=True, **extra))
    return engine


def stoppable(engine: Engine) -> Engine:
    """``engine``, its psycopg2 waits made stoppable (:func:`_wait_stoppable`); other drivers' as
    they are."""
    if engine.dialect.driver == "psycopg2":
        from psycopg2 import extensions

        if extensions.get_wait_callback() is None:  # one of the user's own (a notebook's) is kept
            extensions.set_wait_callback(_wait_stoppable)
    return engine


def _wait_stoppable(conn: Any) -> None:
    """psycopg2's wait callback (``set_wait_callback``, process-wide): libpq otherwise waits inside
    its C code, where Python's signal handlers do not run, and a Ctrl-C while a sweep waited for a
    lock another session held (a schema upgrade, a ``LOCK TABLE``) did nothing until that lock was
    let go, however long. Waited for here with ``poll``, a stop raises as it came, once the
    statement is cancelled on the server (its lock wait ends there too); psycopg2 then closes the
    connection, which SQLAlchemy's pool drops. A connection's ``connect_timeout`` (or
    ``PGCONNECT_TIMEOUT``), which libpq does not apply to a connection made this way, is applied
    here: a server that accepts and never answers was waited for without end."""
    import select

    from psycopg2.extensions import POLL_OK, POLL_READ, POLL_WRITE, STATUS_SETUP

    timeout = _connect_timeout(conn.dsn) if conn.status == STATUS_SETUP else None
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            state = conn.poll()
            if state == POLL_OK:
                return
            if state not in (POLL_READ, POLL_WRITE):
                raise conn.OperationalError(f"bad state from poll: {state}")
            waiting = select.poll()  # not select(): it refuses a descriptor above 1023
            waiting.register(conn.fileno(), select.POLLIN if state == POLL_READ else select.POLLOUT)
            left_ms = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
            if not waiting.poll(left_ms) and deadline is not None and time.monotonic() >= deadline:
                raise conn.OperationalError(f"timeout expired (connect_timeout={timeout:g} s)")
    except KeyboardInterrupt:  # Ctrl-C, and SIGTERM's and SIGHUP's own (interrupts.Terminated)
        with contextlib.suppress(Exception):  # a server gone, or still connecting: nothing to cancel
            conn.cancel()
        raise


def _connect_timeout(dsn: str) -> float | None:
    """libpq's connect timeout for ``dsn``, as libpq reads it: the DSN's ``connect_timeout``, else
    ``PGCONNECT_TIMEOUT``; none (wait without end) where unset or not above 0, at least 2 s."""
    from psycopg2.extensions import parse_dsn

    given = parse_dsn(dsn).get("connect_timeout") or os.environ.get("PGCONNECT_TIMEOUT")
    try:
        seconds = float(given) if given else 0.0
    except ValueError:
        return None
    return max(seconds, 2.0) if seconds > 0 else None


def pg_options(url: str, with_env: bool = True) -> str:
    """The libpq ``options`` a PostgreSQL ``url`` gives (``?options=-csearch_path%3Dperfsweep``:
    a schema of perfsweep's own), one string where the key is given twice (psycopg2 refused the
    list); with ``with_env``, ``PGOPTIONS`` where the URL gives none, as libpq reads it (an
    ``options`` parameter replaces that variable: perfsweep's read-only one did, and a query read
    another schema than the sweep had written). Empty for none."""
    given = make_url(url).query.get("options", ())
    words = [given] if isinstance(given, str) else list(given)
    if not words and with_env and os.environ.get("PGOPTIONS"):
        words = [os.environ["PGOPTIONS"]]
    return " ".join(w for w in words if w)


def installed_driver(url: str) -> str:
    """``url`` with the PostgreSQL driver that is installed where it names none: SQLAlchemy 2.1
    takes a plain ``postgresql://`` for psycopg 3, and perfsweep's ``[postgres]`` extra installs
    psycopg2, so the form perfsweep's own messages suggest failed as "No module named 'psycopg'"."""
    import importlib.util

    if not url.startswith("postgresql://") or importlib.util.find_spec("psycopg") is not None:
        return url
    return "postgresql+psycopg2://" + url.removeprefix("postgresql://") if importlib.util.find_spec("psycopg2") else url


def connect_read_only(url: str) -> Engine:
    """An engine that cannot write, for commands that only read (query, report).

    SQLite: a WAL database with no ``-wal`` file has no writer attached and opens ``immutable``,
    which reads without creating ``-wal``/``-shm`` files, so read-only media work; with a
    ``-wal`` file present a sweep may be writing, and ``mode=ro`` reads through its index.
    PostgreSQL: every transaction of the session is read-only. The schema is not upgraded.
    """
    if (path := sqlite_file(url)) is not None:
        # mode=ro either way: immutable alone opened a missing file read-write, and made it
        flag = {"mode": "ro"} if Path(f"{path}-wal").exists() else {"mode": "ro", "immutable": "1"}
        return create_engine(URL.create("sqlite", database=file_uri(path), query={**flag, "uri": "true"}))
    if url.startswith("postgresql"):
        # standard strings: a server set to read a backslash in '...' as an escape would quote text
        # that perfsweep.query's check reads as unquoted. After the URL's own options (a schema of
        # perfsweep's, -csearch_path=perfsweep), which these replaced: a report then read another
        # schema than the sweep had written; last, so that none of the URL's undoes them.
        options = f"{pg_options(url)} -c default_transaction_read_only=on -c standard_conforming_strings=on"
        return stoppable(create_engine(installed_driver(url), connect_args={"options": options.strip()}))
    return create_engine(url)


def file_uri(path: Path | str) -> str:
    """``file:`` and ``path`` as SQLite's URI filenames take it: escaped, so that a ``%41`` in a
    file's name is not read as ``A`` (another file, read without a word), nor a ``#`` as the end
    of the name (an empty file ``res`` was created for ``res#1.db``, and the read-only flag lost)."""
    return f"file:{quote(str(path))}"


def display_url(engine: Engine) -> str:
    """The database as the user named it: a read-only SQLite engine's ``file:...?immutable=1``
    URI back to ``sqlite:///path``, a password hidden."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and (url.database or "").startswith("file:") and url.query.get("uri"):
        return sqlite_url(unquote(url.database.removeprefix("file:")))
    return hide_password(url.render_as_string(hide_password=True))  # a ?password= option too


def schema_revision(engine: Engine) -> str | None:
    """The Alembic revision the database is at (None for a database perfsweep never wrote)."""
    if "alembic_version" not in inspect(engine).get_table_names():
        return None
    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _alembic_config():
    """Alembic's configuration for perfsweep's migrations (no alembic.ini needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    return cfg


MIGRATION_FILE = re.compile(r"(\d{4})_\w+\.py")
"""A migration's file name: its revision (``0001``, ``0002``, ... in order), then what it does."""


@functools.cache
def head_revision() -> str:
    """The revision this perfsweep's schema is at: its newest migration, the highest number among
    the migration files' names (tests/test_store.py checks each name's number against its
    revision and Alembic's own head). Read without importing Alembic (160 ms) or parsing its
    scripts (50 ms): a query, a report and a sweep on a database at head need neither."""
    names = os.listdir(Path(__file__).parent / "migrations" / "versions")
    return max(m.group(1) for name in names if (m := MIGRATION_FILE.fullmatch(name)))


OWN_SCHEMA = "perfsweep"
"""The schema a PostgreSQL database shared with another application gives perfsweep (README)."""


def own_place(url: str) -> str:
    """Where perfsweep's tables can go instead of a database that holds another application's
    under the same names (its ``alembic_version``, a ``runs`` table): a new file; on a server, a
    schema of perfsweep's own in that database, which the URL's options make the one used."""
    if sqlite_file(url) is not None or not url.startswith("postgresql"):
        return "give a new file or a perfsweep database (db.url=, --db)"
    if pg_options(url, with_env=False):  # a second options= would replace the first: add to it
        where = f"add %20-csearch_path%3D{OWN_SCHEMA} to the URL's options="
    else:
        where = f"add {'&' if '?' in url else '?'}options=-csearch_path%3D{OWN_SCHEMA} to the URL"
    return (
        f"give perfsweep a database of its own, or a schema of its own in this one: run CREATE SCHEMA "
        f"{OWN_SCHEMA}; there, then {where} (quoted in an override, for its '=': db.url='URL')"
    )


def unknown_revision(revision: str, url: str) -> str | None:
    """Why a database at schema ``revision`` is one this perfsweep cannot upgrade, in words: an
    ``alembic_version`` of another application's (an MLflow file given as --db; a server's
    database another application migrates too), or a newer perfsweep's; None for one of
    perfsweep's own revisions up to its head. Both were answered as "older than this perfsweep's;
    upgrade it first", and the upgrade as "No such revision"."""
    head = head_revision()
    if not re.fullmatch(r"\d{4}", revision):  # perfsweep's revisions are numbered 0001, 0002, ...
        return (
            f"not a perfsweep results database: its schema version {revision!r} is another application's "
            f"(its alembic_version table); {own_place(url)}"
        )
    if revision > head:
        return (
            f"its schema revision {revision} is newer than this perfsweep's {head}: it was written by a newer "
            "perfsweep; read and write it with that version"
        )
    return None


_opened_files: weakref.WeakKeyDictionary[Engine, tuple[str, tuple[int, int]]] = weakref.WeakKeyDictionary()
"""The SQLite file each writing engine opened, by device and inode (see :func:`file_replaced`)."""


def file_replaced(engine: Engine) -> str | None:
    """Why a write through ``engine`` would not reach the results file people read, or None.

    A pooled SQLite connection keeps the file it opened: deleted or replaced by another file
    while a job ran, the job's row went into a file nobody can open any more, and the finished
    result was lost without a word. The launcher asks before it stores a run."""
    if (opened := _opened_files.get(engine)) is None:
        return None
    path, identity = opened
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"the database file {path} was deleted while the job ran"
    return None if (st.st_dev, st.st_ino) == identity else f"the database file {path} was replaced while the job ran"


def gone_cause(url: str) -> str:
    """Why a sweep's row would be missing from the database it was reserved in."""
    if url.startswith("sqlite"):
        return "its file was deleted or replaced after the sweep began"
    return "its row was deleted, or the database dropped or replaced, after the sweep began"


def why_refused(engine: Engine, sweep_id: int | None, exc: BaseException) -> str:
    """The first line of a write the database refused; for a foreign-key refusal because the job's
    sweep has no row there any more, that: a database file deleted or replaced after the sweep
    began is made again empty, and every later write of the sweep failed as "FOREIGN KEY constraint
    failed". Only such a refusal costs a query (a server that is down is not asked again)."""
    if sweep_id is None or not isinstance(exc, IntegrityError) or "foreign key" not in str(exc).lower():
        return first_line(exc)
    try:
        with session(engine) as s:
            gone = s.get(Sweep, sweep_id) is None
    except Exception:  # noqa: BLE001 - the driver's own words then say what is wrong
        gone = False
    return f"sweep {sweep_id} is not in the database: {gone_cause(str(engine.url))}" if gone else first_line(exc)


def _new_sqlite_file(path: Path) -> None:
    """Create the SQLite file ``path`` (it does not exist) at the current schema, as a copy of a
    file migrated once for this schema (:func:`schema_template`) rather than through every
    migration: a new file took 0.25 s of Alembic, and a sweep, a test or a notebook that starts a
    new results file pays it each time (the test suite spent 75 CPU-seconds so). The copy is
    linked into place, so a file another process created meanwhile is never replaced; wherever
    the template cannot be made or linked (a cache folder that cannot be written, a filesystem
    without hard links) the file is made and migrated as before."""
    try:
        template = schema_template()
        fresh = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
        try:
            with open(template, "rb") as src, open(fresh, "xb") as dst:
                dst.write(src.read())
            # a template damaged after it was made (truncated by a full disk, overwritten): removed,
            # so that the next new file makes it again; this one is migrated
            if (why := _not_at_head(fresh)) is not None:
                template.unlink(missing_ok=True)
                raise OSError(f"{template}: {why}")
            os.link(fresh, path)
        finally:
            fresh.unlink(missing_ok=True)
    except FileExistsError:
        pass  # another process made it first: it is migrated (or being) like any existing file
    except Exception as exc:  # noqa: BLE001 - any reason: the file is then made the way it always was
        log.debug("new results file %s migrated, not copied from the schema template: %s", path, exc)


def _not_at_head(path: Path) -> str | None:
    """Why the SQLite file ``path`` is not a whole database at the current schema; None if it is.
    Read ``immutable`` (no journal files made beside it); a quick check of every page, then the
    version row."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{file_uri(path)}?immutable=1", uri=True)
        try:
            check = con.execute("PRAGMA quick_check").fetchone()[0]
            version = con.execute("SELECT version_num FROM alembic_version").fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        return str(exc)
    if check != "ok":
        return f"quick_check: {check}"
    return None if version == [(head_revision(),)] else f"schema version {version}, not {head_revision()}"


@functools.cache
def schema_key() -> str:
    """What a newly migrated SQLite file depends on: the head revision, the migration scripts' text
    and the Alembic, SQLAlchemy and SQLite versions that ran them."""
    import hashlib
    import sqlite3
    from importlib.metadata import version

    folder = Path(__file__).parent / "migrations"
    versions = f"{version('alembic')} {version('sqlalchemy')} {sqlite3.sqlite_version}"
    digest = hashlib.sha256(versions.encode())
    for script in sorted(folder.rglob("*.py")):
        digest.update(str(script.relative_to(folder)).encode() + b"\0" + script.read_bytes())
    return f"{head_revision()}-{digest.hexdigest()[:16]}"


def schema_template() -> Path:
    """A SQLite file migrated to the current schema and nothing else, kept in the user's cache
    (perfsweep.cli.user_cache_dir) under :func:`schema_key`: made once, by the migrations
    themselves, and written by rename, so it is whole or absent."""
    folder = user_cache_dir() / "schema"
    template = folder / f"results-{schema_key()}.db"
    if template.exists():
        return template
    folder.mkdir(parents=True, exist_ok=True)
    building = folder / f".{template.name}.{os.getpid()}.{threading.get_ident()}"
    engine = make_engine(sqlite_url(building))
    try:
        try:
            with _migrate_lock:
                upgrade(engine)
        finally:
            engine.dispose()  # the last connection closes: WAL's file is folded into the database
        os.replace(building, template)
    finally:
        for leftover in (building, Path(f"{building}-wal"), Path(f"{building}-shm")):
            leftover.unlink(missing_ok=True)
    return template


_mark_refusals_said: set[tuple[str, str]] = set()
"""(database, error) of :func:`connect`'s marking of dead runs that was refused and said."""


def connect(url: str, check: bool = False) -> Engine:
    """Open the database at ``url`` for writing: bring its schema to the current revision and
    mark the runs of jobs whose process is gone ``interrupted`` (see :func:`mark_interrupted`).
    ``check``: raise :class:`DamagedDatabase` for a damaged file or schema first, as the commands
    that start work or repair do (a sweep, import, upgrade); a job's own connection skips it."""
    if check:
        refuse_damage(url)
    if (path := sqlite_file(url)) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _new_sqlite_file(path)
    engine = make_engine(url)
    with _migrate_lock:
        upgrade(engine)
    if check:
        refuse_damage(url, engine)
    if engine.dialect.name == "sqlite" and engine.url.database and ":memory:" not in engine.url.database:
        st = os.stat(engine.url.database)  # upgrade() has created it
        _opened_files[engine] = (engine.url.database, (st.st_dev, st.st_ino))
    try:
        mark_interrupted(engine)
    except Exception as exc:  # noqa: BLE001 - housekeeping must not stop a sweep or an import
        said = (hide_password(url), first_line(exc))
        # once a process: a resume's sweeper opens the database several times, and printed it each
        # time before its one-line answer (found by a fault-injection pass)
        (log.debug if said in _mark_refusals_said else log.warning)(
            "could not mark the runs of dead jobs interrupted: %s", said[1]
        )
        _mark_refusals_said.add(said)
    return engine


def file_damage(url: str) -> str | None:
    """What SQLite's own ``quick_check`` finds wrong with the file at ``url`` (a malformed page, a
    broken index), in words, or None; None too for a file not there yet or another database.
    Run before the schema is touched: a damaged file failed later with whatever the first read
    of the broken page raised (a UnicodeDecodeError, "database disk image is malformed"). It reads
    the whole file: about 0.35 s for 258 MB."""
    if (path := sqlite_file(url)) is None or not path.is_file():
        return None
    import sqlite3

    try:
        flag = "mode=ro" if Path(f"{path}-wal").exists() else "immutable=1"  # as connect_read_only: read-only media
        con = sqlite3.connect(f"{file_uri(path)}?{flag}", uri=True, timeout=30)
        try:
            problems = [str(r[0]) for r in con.execute("PRAGMA quick_check(3)")]
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:  # too broken to check; a file that is no database is said elsewhere
        return None if "not a database" in str(exc) else f"SQLite cannot read it ({exc})"
    return None if problems == ["ok"] else f"SQLite finds it damaged ({'; '.join(problems)})"


def schema_damage(engine: Engine) -> str | None:
    """A table or column of the current schema missing from a database that says it is at the
    current revision (dropped by hand, a half-restored backup), in words, or None. Such a file
    was opened, migrated as "at head" and took the sweep's row; every job then trained and could
    not store its result. Checked before any job starts and by ``perfsweep upgrade``."""
    found = inspect(engine)
    tables = set(found.get_table_names())
    if missing := [t.name for t in Base.metadata.sorted_tables if t.name not in tables]:
        return f"table{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing"
    for table in Base.metadata.sorted_tables:
        have = {c["name"] for c in found.get_columns(table.name)}
        if lost := [c.name for c in table.columns if c.name not in have]:
            return f"column{'s' if len(lost) > 1 else ''} {', '.join(f'{table.name}.{c}' for c in lost)} missing"
    return None


DAMAGE_HINT = "perfsweep cannot repair it: restore it from a backup, or give another database (db.url=, --db)"


class DamagedDatabase(UserError):
    """A database :func:`file_damage` or :func:`schema_damage` finds broken; its text says what,
    and that perfsweep cannot repair it."""


class ForeignDatabase(DamagedDatabase):
    """A database without perfsweep's schema version that already has a table of one of
    perfsweep's names: someone else's ``runs``. Creating the schema there failed as "already
    exists", which :func:`upgrade` took for another job's migration and retried for 5 s, saying
    that it waited for a lock nobody held. Also a SQLite file holding only another application's
    tables (perfsweep's were added beside them, in a file that is that application's to keep),
    and a schema version that is not perfsweep's (:func:`unknown_revision`). Unrelated tables
    beside ours in a shared PostgreSQL database are fine."""


def unreadable(url: str) -> str | None:
    """Why SQLite cannot even open the file at ``url`` to read it, where that is no damage: a
    file this user may not read, or a write-ahead log (``-wal``) with no index (``-shm``) in a
    folder SQLite may not create one in (read-only media). Both read as "unable to open database
    file", which was answered as damage: "restore it from a backup", of a healthy file."""
    if (path := sqlite_file(url)) is None or not path.is_file():
        return None
    if not os.access(path, os.R_OK):
        return f"this user may not read {path} (its permissions); use it as its owner, or a copy"
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    if wal.exists() and not shm.exists() and not os.access(path.parent, os.W_OK):
        return (
            f"it has a write-ahead log ({wal.name}) but no index ({shm.name}), which SQLite must create to "
            f"read it and cannot in the read-only folder {path.parent}; copy the file with its {wal.name} to a "
            "writable folder and use the copy"
        )
    return None


def refuse_damage(url: str, engine: Engine | None = None) -> None:
    """Raise :class:`DamagedDatabase` for the file at ``url`` (before its schema is touched) or,
    given ``engine``, for its schema (once it is at the current revision); ``engine`` is disposed.
    A file SQLite cannot open for want of permission is :class:`UserError` saying so (:func:`unreadable`)."""
    if engine is None and (why := unreadable(url)):
        raise UserError(why)
    problem = file_damage(url) if engine is None else schema_damage(engine)
    if problem:
        if engine is not None:
            engine.dispose()
        raise DamagedDatabase(f"{problem}; {DAMAGE_HINT}")


@contextmanager
def _sqlite_foreign_keys_off(conn: Any) -> Iterator[None]:
    """Foreign keys off on a SQLite connection while it migrates: a migration that copies a table
    (SQLite's only way to change a column) drops the old copy, which children still reference.
    The pragma only takes effect outside a transaction, so it goes to the driver before BEGIN;
    :func:`upgrade` checks every reference before it commits, and the pragma is back on after."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = conn.connection.driver_connection
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        raw.execute("PRAGMA foreign_keys=ON")


OUR_TABLES = frozenset(Base.metadata.tables)
"""perfsweep's tables: a database without perfsweep's schema version that holds one is not ours."""


def upgrade(engine: Engine) -> None:
    """Run Alembic's upgrade to head on ``engine`` (a no-op when already current)."""
    if _at_head(engine):  # every sweep, import and resume of an existing database: Alembic not imported
        return
    from alembic import command
    from alembic.migration import MigrationContext

    cfg = _alembic_config()
    for attempt in range(5):
        try:
            with engine.connect() as conn, _sqlite_foreign_keys_off(conn), conn.begin():
                if conn.dialect.name == "postgresql":
                    # one migrator at a time: the others wait here, then find the schema at head
                    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7210400501)")
                cfg.attributes["connection"] = conn
                before = MigrationContext.configure(conn).get_current_revision()
                url = engine.url.render_as_string(hide_password=False)
                if before is not None and (why := unknown_revision(before, url)):
                    raise ForeignDatabase(why)
                if before == head_revision():  # migrated by another process while this one waited for its lock
                    return
                tables = set(inspect(conn).get_table_names()) if before is None else set()
                if clash := sorted(tables & OUR_TABLES):
                    raise ForeignDatabase(
                        f"not a perfsweep results database: it holds table{'s' if len(clash) > 1 else ''} "
                        f"{', '.join(clash)} but no perfsweep schema version; {own_place(url)}"
                    )
                if tables and conn.dialect.name == "sqlite":  # a server's database is shared by design
                    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
                    raise ForeignDatabase(
                        f"not a perfsweep results database: this SQLite file holds another application's tables "
                        f"({shown}); perfsweep keeps a file of its own: give a new file or a perfsweep database "
                        "(db.url=, --db)"
                    )
                command.upgrade(cfg, "head")
                migrated = MigrationContext.configure(conn).get_current_revision() != before
                if (
                    migrated
                    and conn.dialect.name == "sqlite"
                    and (bad := conn.exec_driver_sql("PRAGMA foreign_key_check").first())
                ):
                    raise IntegrityError(
                        "PRAGMA foreign_key_check", None, Exception(f"broken reference after upgrade: {bad}")
                    )
            return
        except (OperationalError, IntegrityError) as exc:  # another job migrating at the same time
            racing = isinstance(exc, IntegrityError) or any(w in str(exc) for w in ("locked", "already exists"))
            if attempt == 4 or not racing:  # e.g. 'unable to open database file': retrying cannot help
                raise
            log.debug("schema upgrade raced with another process (%s); retrying", exc)
            time.sleep(0.5 * (attempt + 1))


def _at_head(engine: Engine) -> bool:
    """Whether the database's schema version is this perfsweep's head; False for anything else
    (no version table, an older or foreign version, an error), which :func:`upgrade` then
    handles. Read through the driver's own connection, outside SQLAlchemy's transaction: on
    SQLite that is a plain read of the last commit (WAL), where perfsweep's ``BEGIN IMMEDIATE``
    waited for another writer's lock, 30 s for a file held locked, before upgrade's own tries."""
    try:
        raw = engine.raw_connection()
    except DBAPIError:  # a file that cannot be opened, a server not there: upgrade says which
        return False
    try:
        cursor = raw.cursor()
        cursor.execute("SELECT version_num FROM alembic_version")
        row = cursor.fetchone()
        cursor.close()
        return row is not None and row[0] == head_revision()
    except engine.dialect.loaded_dbapi.Error:
        return False
    finally:
        raw.close()  # back to the pool, rolled back


@contextmanager
def session(engine: Engine) -> Iterator[Session]:
    """One transaction: committed on success, rolled back (nothing written) on error."""
    with Session(engine, expire_on_commit=False) as s, s.begin():
        yield s


def sweep_of(engine: Engine, sweep_dir: str) -> tuple[int, str | None] | None:
    """The id and command of the sweep whose folder is ``sweep_dir``, if the database has one."""
    with session(engine) as s:
        row = s.execute(select(Sweep.id, Sweep.command).where(Sweep.sweep_dir == sweep_dir)).first()
        return None if row is None else (row[0], row[1])


def get_or_create_sweep(engine: Engine, sweep_dir: str, name: str, **fields: Any) -> int:
    """The id of the sweep for ``sweep_dir``; jobs of one sweep on several machines share it."""
    for _ in range(3):
        if (found := sweep_of(engine, sweep_dir)) is not None:
            return found[0]
        try:
            with session(engine) as s:
                sw = Sweep(name=name, sweep_dir=sweep_dir, **fields)
                s.add(sw)
                s.flush()
                return sw.id
        except IntegrityError:  # created by a concurrent job between our select and insert
            continue
    raise RuntimeError(f"could not create or find the sweep row for {sweep_dir}")


def start_sweep(engine: Engine, sweep_dir: str, name: str, **fields: Any) -> int:
    """Find or create the sweep's row and mark it ``running`` by this process (a real write)."""
    sweep_id = get_or_create_sweep(engine, sweep_dir, name, **fields)
    with session(engine) as s:
        s.execute(
            update(Sweep)
            .where(Sweep.id == sweep_id)
            .values(
                status="running",
                pid=os.getpid(),
                hostname=fields.get("hostname") or socket.gethostname(),
                heartbeat_at=func.now(),
                finished_at=None,
            )
        )
    return sweep_id


def end_sweep(engine: Engine, sweep_id: int, status: str, at_last_run: bool = False) -> None:
    """Mark the sweep ``done`` or ``interrupted`` with its end time (database clock). With
    ``at_last_run`` (a sweep closed later than its jobs ended, by ``perfsweep resume``) the end
    is its last run's, not the time of closing, so the sweep's span stays the time it ran."""
    with session(engine) as s:
        end = func.now()
        if at_last_run and (last := s.scalar(select(func.max(Run.finished_at)).where(Run.sweep_id == sweep_id))):
            end = last
        s.execute(update(Sweep).where(Sweep.id == sweep_id).values(status=status, finished_at=end))


def begin_run(engine: Engine, row: dict[str, Any]) -> int:
    """Insert the job's row as ``running`` before it starts, so a killed sweep leaves a trace."""
    with session(engine) as s:
        run = Run(**row, status="running", heartbeat_at=func.now())
        s.add(run)
        s.flush()
        return run.id


def heartbeat(engine: Engine, run_id: int) -> None:
    """Stamp the running job with the database's clock (hosts' clocks may differ)."""
    with session(engine) as s:
        s.execute(update(Run).where(Run.id == run_id, Run.status == "running").values(heartbeat_at=func.now()))


def sweep_heartbeat(engine: Engine, sweep_id: int) -> None:
    """Stamp the sweep with the database's clock while its sweeper (or single run) is alive."""
    with session(engine) as s:
        s.execute(update(Sweep).where(Sweep.id == sweep_id).values(heartbeat_at=func.now()))


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by someone else
        return False
    return False


def _db_now(s: Session) -> datetime:
    value = s.scalar(select(func.now()))
    if isinstance(value, str):  # SQLite's CURRENT_TIMESTAMP: 'YYYY-MM-DD HH:MM:SS' in UTC
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def mark_interrupted(engine: Engine) -> int:
    """Rows left ``running`` by a process that is gone become ``interrupted``; returns how many.

    Gone means: on this host, its pid no longer exists; on another host, its heartbeat is older
    than names.HEARTBEAT_STALE_S by the database's clock. Their sweeps are marked interrupted with an
    end time. Finished rows are never touched.
    """
    host = socket.gethostname()
    with session(engine) as s:
        now = _db_now(s)
        stale = now - timedelta(seconds=HEARTBEAT_STALE_S)

        def dead(row_host: str | None, pid: int | None, beat: datetime | None) -> bool:
            if row_host == host and pid is not None:  # this host can see the process: that decides
                return _process_gone(pid)
            return beat is not None and beat < stale

        runs = s.execute(
            select(Run.id, Run.sweep_id, Run.hostname, Run.pid, Run.heartbeat_at).where(Run.status == "running")
        ).all()
        gone_runs = [r for r in runs if dead(r.hostname, r.pid, r.heartbeat_at)]
        commands = (  # what each gone run's error says to do depends on its sweep's command
            dict(
                s.execute(
                    select(Sweep.id, Sweep.command).where(Sweep.id.in_(sorted({r.sweep_id for r in gone_runs})))
                ).all()
            )
            if gone_runs
            else {}
        )
        for r in gone_runs:
            s.execute(
                update(Run)
                .where(Run.id == r.id, Run.status == "running")
                .values(
                    status="interrupted",
                    finished_at=r.heartbeat_at or now,
                    error="interrupted: the job's process went away before it reported (killed, Ctrl-C or lost host); "
                    + RERUN_HINTS[is_multirun(commands.get(r.sweep_id))],
                )
            )
        sweeps = s.execute(
            select(Sweep.id, Sweep.hostname, Sweep.pid, Sweep.heartbeat_at).where(Sweep.status == "running")
        ).all()
        live_runs = {r.sweep_id for r in runs if r not in gone_runs}
        for sw in sweeps:
            if sw.id not in live_runs and dead(sw.hostname, sw.pid, sw.heartbeat_at):
                s.execute(
                    update(Sweep)
                    .where(Sweep.id == sw.id, Sweep.status == "running")
                    .values(status="interrupted", finished_at=sw.heartbeat_at or now)
                )
                s.execute(  # a batch=max search dies with its sweeper
                    update(BatchSearch)
                    .where(BatchSearch.sweep_id == sw.id, BatchSearch.status == "running")
                    .values(
                        status="interrupted",
                        error="the sweep's process went away before the search finished",
                        finished_at=sw.heartbeat_at or now,
                    )
                )
    if gone_runs:
        log.warning("marked %d run(s) interrupted: their processes are gone", len(gone_runs))
    return len(gone_runs)


RUN_CHILDREN: dict[str, type[Base]] = {
    "steps": Step,
    "stages": Stage,
    "kernels": Kernel,
    "ops": Op,
    "artifacts": Artifact,
}
"""A result's lists of rows (:func:`save_run`), each stored in its own table under the run."""

_TAKES: tuple[tuple[type | tuple[type, ...], tuple[type, ...], str], ...] = (
    (Real, (int, float), "a number"),
    (UTCDateTime, (datetime, str), "an ISO 8601 time"),
    (PortableJSON, (dict,), "a JSON object"),
    (Boolean, (bool,), "true or false"),
    (Integer, (int,), "a whole number"),  # BigInteger too
    ((String, Text), (str,), "text"),
)


def shown_value(value: Any) -> str:
    kind = {bool: "true/false", int: "a number", float: "a number", str: "text", dict: "a JSON object"}
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return f"{shown} ({kind.get(type(value), type(value).__name__)})"


def field_problem(cls: type[Base], row: Any, where: str) -> str | None:
    """The first field of ``row`` that table ``cls`` would not take as it is, in one line naming
    the field, its value and what the column takes (None when every field fits). For results read
    from files (perfsweep import): a ``status: 5`` or a ``config_json`` given as text was stored,
    and the sweep's report failed later, or the driver's refusal was blamed on the database."""
    table = cls.__tablename__
    if not isinstance(row, dict):
        return f"{where} is {shown_value(row)}, not a JSON object of {table} columns"
    columns = cls.__table__.columns
    for key, value in row.items():
        col = columns.get(key)
        if col is None:
            return f"{where}.{key}: {table} has no such column"
        said, accepted = next(((said, ok) for types, ok, said in _TAKES if isinstance(col.type, types)), ("", ()))
        if value is None:
            if not (col.nullable or col.primary_key or col.foreign_keys):
                return f"{where}.{key} is null; {table}.{key} takes {said}"
            continue
        if accepted and (not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted)):
            return f"{where}.{key} is {shown_value(value)}; {table}.{key} takes {said}"
        # what the driver refused later, blamed on the database: 300 characters for a String(16), 10**30
        if isinstance(col.type, String) and col.type.length and len(value) > col.type.length:
            return f"{where}.{key} is {len(value)} characters long; {table}.{key} takes at most {col.type.length}"
        if isinstance(col.type, Integer) and not isinstance(value, bool):
            bits = 63 if isinstance(col.type, BigInteger) else 31
            if not -(2**bits) <= value < 2**bits:
                return f"{where}.{key} is {shown_value(value)}; {table}.{key} takes a whole number under 2**{bits}"
        if isinstance(col.type, UTCDateTime) and isinstance(value, str):
            try:
                datetime.fromisoformat(value)
            except ValueError:
                return f"{where}.{key} is {shown_value(value)}; {table}.{key} takes {said}"
    missing = [
        c.name
        for c in columns
        if not (c.nullable or c.primary_key or c.foreign_keys or c.default is not None or c.server_default is not None)
        and c.name not in row
    ]
    return f"{where} has no {', '.join(missing)}" if missing else None


def save_run(engine: Engine, result: dict[str, Any], run_id: int | None = None) -> int:
    """Write one finished job (run row plus its steps, stages, ops, artifacts) in one transaction.

    With ``run_id`` the job's ``running`` (or ``interrupted``) row gets the outcome in place; a
    row that already holds a final status is never overwritten, the result is added beside it.
    """
    result = dict(result)
    children = {attr: (cls, result.pop(attr, []) or []) for attr, cls in RUN_CHILDREN.items()}
    columns = set(Run.__table__.columns.keys())
    unknown = set(result) - columns
    if unknown:
        raise ValueError(f"result has fields that runs does not: {sorted(unknown)}")
    for attr, (cls, rows) in children.items():
        extra = {k for row in rows for k in row} - set(cls.__table__.columns.keys())
        if extra:
            raise ValueError(f"{attr} rows have fields that {cls.__tablename__} does not: {sorted(extra)}")
    for key in ("started_at", "finished_at", "heartbeat_at"):
        if isinstance(result.get(key), str):
            result[key] = datetime.fromisoformat(result[key])
    with session(engine) as s:
        run = s.get(Run, run_id) if run_id is not None else None
        if run is not None and run.status not in FINAL_STATUSES:
            for key, value in result.items():
                if key != "id":
                    setattr(run, key, value)
        else:
            result.pop("id", None)
            run = Run(**result)
            s.add(run)
        for attr, (cls, rows) in children.items():
            getattr(run, attr).extend(cls(**row) for row in rows)
        s.flush()
        return run.id


def json_default(o: Any) -> Any:
    """JSON for what a result row holds besides plain values (datetimes as ISO 8601 UTC)."""
    if isinstance(o, datetime):
        return o.astimezone(timezone.utc).isoformat()
    return str(o)


def search_best_figures(s: Session, search_id: int, max_batch: int | None) -> dict[str, Any]:
    """The ``batch_searches`` columns copied from the search's ok run at ``max_batch``."""
    best = None
    if max_batch is not None:
        best = s.scalars(
            select(Run)
            .where(Run.batch_search_id == search_id, Run.batch == max_batch, Run.status == "ok")
            .order_by(Run.id.desc())
        ).first()
    return {
        "best_run_id": best.id if best else None,
        "tokens_per_s": best.tokens_per_s if best else None,
        "samples_per_s": best.samples_per_s if best else None,
        "peak_allocated_bytes": best.peak_allocated_bytes if best else None,
    }


def refresh_search_figures(engine: Engine, sweep_id: int) -> None:
    """Copy each search's figures from its run at max_batch again: a run stored later (its result
    kept on disk while the database refused it, then ``perfsweep import``) left them empty."""
    with session(engine) as s:
        found = s.execute(
            select(BatchSearch.id, BatchSearch.max_batch).where(
                BatchSearch.sweep_id == sweep_id, BatchSearch.max_batch.is_not(None)
            )
        ).all()
        for search_id, max_batch in found:
            s.execute(
                update(BatchSearch)
                .where(BatchSearch.id == search_id)
                .values(**search_best_figures(s, search_id, max_batch))
            )
