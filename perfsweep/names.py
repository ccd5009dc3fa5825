"""perfsweep's shared vocabulary: stage names, kernel categories and verdict thresholds.

Imports nothing heavy (no torch, no pandas), so the CLI, the trace analysis, the store and the
report can all share these names without paying for torch at import time.
"""

from __future__ import annotations

import shlex

OLDEST_TORCH: tuple[int, int] = (2, 6)
"""The oldest torch release the whole suite has passed on (docs/benchmarks.md, "The suite under
older torch"), and pyproject.toml's lower bound. Under 2.4.1 jobs trained but Dynamo's counters
read differently: recompilations and compile-cache hits were stored as 0; under 2.3.1 no CPU job
trained. A sweep under an older torch says so before its jobs start (preflight.torch_notice)."""

LARGE_GRID_POINTS = 100
"""From this many grid points the sweep says, before composing them all, how long that will take:
Hydra composed 1,000 points in about 80 s on a 2-core VM (80 ms each), silently until now."""

GRID_AXES: tuple[str, ...] = ("amp", "ckpt", "batch", "seq_len", "compile", "workers")
"""The sweep axes: top-level keys of ``PerfsweepConfig`` and real columns of ``runs``."""

NOT_MEASURED: tuple[str, ...] = (
    "db",
    "name",
    "timeout_s",
    "allow_failures",
    "resume",
    "sweep",
    "repeat",
    "order",
    "report",
    "skip_predicted_oom",
    "max_batch_cap",
    "launcher",
)
"""Config keys that say where results go or how the sweep behaves, not what is measured: left out
of ``runs.config_hash`` and of the settings that tell configs apart. ``launcher`` (how many jobs
run at once) can change the numbers, so the sweep stores it (``sweeps.parallel``) and the summary
warns; it does not change what a grid point is."""

HASHED_UNLESS_DEFAULT: dict[str, object] = {"nproc": None}
"""Measured keys added after results existed: in ``runs.config_hash`` only when not at this
default, so a config from before the key hashes as it did (``resume`` still finds its ok runs)."""

SETTING_PREFIX = "cfg."
"""Report columns named ``cfg.<key>`` (``cfg.model.width``) hold a config key outside the axes that
tells a sweep's configs apart (a factory's own keys, ``lr``); labels show it as ``model.width=64``."""

ON_OFF_AXES: tuple[str, ...] = ("amp", "ckpt", "compile")
"""Grid axes that switch a technique on or off: the factors of the factorial analysis; the
default baseline has the fewest of them on (:data:`BASELINE_RULE`)."""

BASELINE_RULE = (
    "the first config in grid order with the fewest of amp, ckpt and compile on (all off where the grid has it)"
)
"""The default baseline of the stored speedups (perfsweep.summary.fill_speedups) and of a report
(perfsweep.configs.baseline), both through perfsweep.configs.fewest_on. The fewest, not all off:
experiments/compile.yaml holds amp on, and its eager config was reported as 0.63x slower than
the compiled one, its first."""

ENVIRONMENT_COLUMNS: tuple[str, ...] = (
    "hostname",
    "device_name",
    "gpu_driver_version",
    "gpu_total_memory_bytes",
    "gpu_compute_capability",
    "cpu_model",
    "cpu_count",
    "cpus_allotted",
    "torch_threads",
    "torch_version",
    "cuda_version",
    "cudnn_version",
    "python_version",
    "tf32_matmul",
    "tf32_cudnn",
    "cudnn_benchmark",
    "cuda_alloc_conf",
    "git_commit",
    "git_dirty",
)
"""``runs`` columns that describe where a run ran: a difference in any of them can explain a
difference in the numbers, so the report and the sweep comparison list them."""

STACKS_ENV = "PERFSWEEP_STACKS_ON_SIGUSR1"
"""Set to 1, a perfsweep command prints every thread's Python stack to stderr on SIGUSR1 and goes
on (faulthandler). Off by default: SIGUSR1 otherwise ends the process, and a scheduler may send it."""

JOB_PROCESS_NAME = "perfsweep-job"
"""What ``ps`` and ``top`` call a job's process (its ``/proc/PID/comm``, set as it starts:
perfsweep.job_entry): a job forked from the job server has the server's command line."""

CHECK_PROCESS_NAME = "perfsweep-check"
"""What they call a process the sweep forks from the job server for its own checks
(perfsweep.job_start.call), so that it is not taken for a job."""

EARLY_JOB_SERVER_ENV = "PERFSWEEP_EARLY_JOB_SERVER"
"""``1``: a sweep starts its job server as soon as its grid is composed; ``0``: with its first job
(the sweep then imports torch for its own checks); unset: early where a core is spare, else when
the sweep first needs torch (perfsweep.job_start.start_early)."""

JOB_SERVER_READY_ENV = "PERFSWEEP_JOB_SERVER_READY"
"""Set by the sweep as it starts its job server: the file the server creates once its imports
are done (perfsweep.job_server_ready)."""


DEVICE_TIME_BY_LAUNCH = "cuda_kernels_by_launch"
"""``stages.device_time_source`` of GPU time attributed to the stage whose CPU range launched each
kernel, whatever thread launched it (backward's kernels come from autograd's thread)."""
DEVICE_TIME_SAME_AS_CPU = "same_as_cpu"
"""``stages.device_time_source`` on CPU: the device time is the CPU time, not measured apart."""
DEVICE_TIME_BEFORE_LAUNCH = "cuda_kernels"
"""``stages.device_time_source`` of runs stored before schema 0002: kernels counted inside the main
thread's ranges only, so backward (launched from autograd's thread) read ~0 ms. Not drawn."""

STAGES: tuple[str, ...] = ("data_to_device", "forward", "backward", "optimizer_step", "zero_grad")
"""record_function range names of one training step, in order."""

PROFILER_STEP_PREFIX = "ProfilerStep#"
"""torch.profiler's schedule wraps each profiled step in a range named ``ProfilerStep#N``."""

KERNEL_CATEGORIES: tuple[str, ...] = (
    "communication",
    "memcpy/memset",
    "attention",
    "optimizer",
    "gemm",
    "elementwise/norm",
    "reduction",
    "other",
)
"""Categories of GPU work in the ``kernels`` table and ``perfsweep trace``; rules in
:data:`perfsweep.trace.KERNEL_RULES`."""

HOST_COLLECTIVE_PREFIXES: tuple[str, ...] = ("gloo:",)
"""Trace ranges of a collective run by the host (torch.distributed's gloo backend records
``gloo:all_reduce`` on its worker threads); on a GPU, communication kernels say it instead."""

# --- timing quality ------------------------------------------------------------------------

NOISY_IQR_FRACTION = 0.10
"""A run whose measured step times have an interquartile range above this share of their median
is flagged noisy (``runs.noisy``): differences of that size between configs may be noise."""

NOISY_TAIL_FRACTION = 0.10
"""A run whose mean step time is more than this share off its median is flagged noisy too. The
IQR does not see a few slow steps (a stall: page faults, another process, a collector pause), yet
they move the mean and, with it, tokens/s, which counts the window's wall time: a run measured
with IQR 5% of its median and CV 144% was not flagged. The mean's move is what the stalls cost the
headline, whatever the number of steps; a CV threshold is not (one step 3x the median among 20 is
CV 41%, among 200 CV 14%, while it moves the mean 10% and 1%)."""

NOISY_RULE = (
    f"step-time IQR > {NOISY_IQR_FRACTION:.0%} of the median, "
    f"or mean more than {NOISY_TAIL_FRACTION:.0%} off the median"
)
"""The rule as stored in ``runs.noisy_rule``, so old rows say which rule judged them (rows
written before schema 0012 were judged by the IQR alone)."""

NOISY_RULE_IQR_ONLY = "step-time IQR > 10% of the median"
"""The rule of every flag written before schema 0012 (which sets it on the rows it finds), and of
a result kept as result.json by such a perfsweep and imported later."""

# --- numerics audit (perfsweep.audit) ------------------------------------------------------

LOSS_TOLERANCE: dict[str, float] = {"fp32": 1e-3, "bf16": 2e-2, "fp16": 2e-2}
"""Largest relative loss difference from the FP32-eager twin, per step, by the run's compute dtype.
fp32 (checkpointing, compile): the same math reordered at most; measured 0 for checkpointing (also
with dropout: the RNG is replayed) and for compile with aot_eager on CPU. bf16/fp16: 8 and 11
mantissa bits round each op by up to 0.4%/0.05%; measured 3e-5 over 12 steps of the default model
on CPU. A broken setting moves the loss by far more (lr 0.05: 2.4x by step 3; a GradScaler whose
scale underflows the gradients leaves the loss where it started)."""

# --- bottleneck verdict --------------------------------------------------------------------

DATA_BOUND_WAIT_FRACTION = 0.10
"""A run whose measured steps spend more than this share waiting for the next batch is ``data``."""

GPU_BOUND_BUSY_FRACTION = 0.70
"""A run whose GPU is busy at least this share of the median step is ``gpu``; below it the GPU
sits idle waiting for the host to launch work, and the run is ``host`` (launch/CPU bound)."""

BOTTLENECK_RULE = (
    f"data if data_wait_fraction > {DATA_BOUND_WAIT_FRACTION:g}; "
    f"else gpu if gpu_busy_fraction >= {GPU_BOUND_BUSY_FRACTION:g}; else host"
)
"""The rule as stored in ``runs.bottleneck_rule``, so old rows say which thresholds judged them."""

BOTTLENECKS: tuple[str, ...] = ("gpu", "host", "data")

# --- run and sweep lifecycle ---------------------------------------------------------------

RUN_STATUSES: tuple[str, ...] = ("running", "ok", "failed", "oom", "timeout", "interrupted", "skipped")
"""``runs.status``. A row is written ``running`` when its job starts and gets its outcome at the
end; ``interrupted`` means the job's process went away without one (Ctrl-C, kill -9, a lost node);
``skipped``: not trained, because ``skip_predicted_oom=true`` and the memory ledger predicted
more than the device had free."""

RERUN_HINTS: dict[bool, str] = {True: "perfsweep resume reruns it", False: "run its command again to measure it"}
"""What an ``interrupted`` run's error tells the user to do, for a multirun (True) and a single
run (False): ``perfsweep resume`` refuses single runs, which have no grid to finish."""


def is_multirun(command: str | None) -> bool:
    """Whether a stored ``sweeps.command`` was a multirun, the only kind ``perfsweep resume`` reruns."""
    try:
        words = shlex.split(command or "")
    except ValueError:  # not written by perfsweep (which stores shlex.join's output)
        words = (command or "").split()
    return "-m" in words or "--multirun" in words


def interrupted_tail(multirun: bool) -> str:
    """How an ``interrupted`` run's error ends, after what stopped it ("interrupted (SIGINT) ...")."""
    return f"before the job finished; {RERUN_HINTS[multirun]}"


FINAL_STATUSES: tuple[str, ...] = ("ok", "failed", "oom", "timeout", "skipped")
"""Statuses of a job that ran to an outcome; ``perfsweep import`` never overwrites these."""

UNSAVED_STATUS = "unsaved"
"""Shown in a sweep's summary, never stored: the job finished but the database refused its
result, which is kept as result.json until ``perfsweep import`` stores it (its row says ``running``)."""

EXIT_0_STATUSES: tuple[str, ...] = ("ok", "skipped")
"""Outcomes that leave the exit code 0 without ``allow_failures``: a skip is what the user asked for."""

SWEEP_STATUSES: tuple[str, ...] = ("running", "done", "interrupted")
"""``sweeps.status``: ``done`` once the summary ran, whatever the jobs' outcomes."""

NOT_OVERRIDES: tuple[str, ...] = ("resume=", "repeat=", "order=", "report=", "sweep.", "launcher.")
"""Overrides that do not name the grid point: how the sweep runs (``resume``, ``repeat``,
``order``, ``report``, ``launcher.*``) and the ``sweep.*`` context the sweeper adds to every job."""

SEARCH_ANSWERED: tuple[str, ...] = ("done", "none_fit")
"""``batch_searches.status`` of a search that found its answer (the largest batch, or that none
fits): resume keeps it; one that failed, was interrupted or is still running is searched again."""

SCHEDULER_TIME_MARGIN_S = 300.0
"""Time a scheduler's limit (SLURM's ``--time``, from ``hydra.launcher.timeout_min``) allows a job
beyond twice ``timeout_s`` (start-up, then training): its data, its result, and submitit's
warning signal (``signal_delay_s``, 120 s in hydra-submitit-launcher) before the limit. perfsweep derives the limit with it, so its own timeout is what ends a slow job."""

MULTI_HOST_LAUNCHERS: tuple[str, ...] = ("SlurmLauncher",)
"""Hydra launchers (by class name) whose jobs may run on several hosts at once."""

NETWORK_FILESYSTEMS: tuple[str, ...] = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph")
"""Filesystem types (a FUSE type by its last part: fuse.beegfs is beegfs) on which a SQLite file
cannot take writes from several hosts: perfsweep refuses them for multi-host sweeps."""

HEARTBEAT_INTERVAL_S = 5.0
"""How often a job's launcher stamps ``runs.heartbeat_at`` (and its sweep's) with the database clock."""

HEARTBEAT_STALE_S = 120.0
"""A ``running`` row whose heartbeat is older than this (database clock) is ``interrupted``: the
rule that covers jobs on other hosts, whose processes this host cannot see."""

CPU_CHECK_MAX_PARAMS = 100_000_000
"""A model whose forward the meta device cannot run (data-dependent ops: ``.item()``, Hugging
Face's mask checks) is checked before the jobs by one step on the CPU on a one-sample batch
when it has at most this many parameters (400 MB in fp32 with as much again for gradients);
a larger one is checked by its first job."""

PROFILED_STEP_WARN_RATIO = 1.5
"""The profiled steps' CPU stage time over the measured median step above which the report's
breakdown chart says that the profiler's own cost is in its bars."""

SWEEP_MARKER = ".perfsweep-sweep"
"""The file that makes a folder one sweep's (or one plain run's) own (perfsweep.preflight.claim_folder);
``perfsweep resume`` looks for it before sending jobs back into the folder."""
