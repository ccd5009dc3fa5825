"""Where each job runs on this machine: slots of GPUs and CPU cores for ``launcher.parallel``.

A slot is a disjoint share of the machine: on CUDA ``gpus_per_job`` GPUs, named to the job
through ``CUDA_VISIBLE_DEVICES`` (so inside it they are cuda:0..n-1), and on any device an equal
share of the cores the launcher may use, applied in the job as its CPU affinity and its torch
thread count. Jobs never share a slot: :class:`SlotPool` hands each job a free one and makes the
next wait. One job at a time (``parallel=1``) keeps the whole machine and changes nothing.

Torch-free, like perfsweep.names: the sweeper plans slots before any job imports torch, and
without opening a CUDA context (GPUs are counted from ``CUDA_VISIBLE_DEVICES`` or NVML).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from perfsweep import cgroups
from perfsweep.config import ConfigError, Device


@dataclass(frozen=True)
class Placement:
    """One slot: what a job may use. ``None`` fields leave the job as it was started."""

    slot: int
    cpus: tuple[int, ...] | None = None
    """CPU affinity of the job (and of its ranks, which split it)."""
    gpus: tuple[str, ...] | None = None
    """``CUDA_VISIBLE_DEVICES`` entries (indices or UUIDs as the launcher saw them)."""

    def env(self) -> dict[str, str]:
        """Environment variables the job process is started with."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus)} if self.gpus is not None else {}


def cpu_list(cpus: list[int] | tuple[int, ...] | set[int]) -> str:
    """``0-3,8,10-11``: the compact form of a CPU set, as taskset and /proc print it."""
    out: list[str] = []
    ordered = sorted(cpus)
    start = prev = None
    for c in [*ordered, None]:
        if start is not None and c == prev + 1:  # type: ignore[operator]
            prev = c
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = c
    return ",".join(out)


def usable_cpus() -> list[int]:
    """The cores this process may run on (its affinity mask: a container's or SLURM's share)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def allowed_cpus() -> list[int]:
    """The cores jobs may keep busy at once: the affinity mask's, no more than the cgroup's CPU
    quota allows (cgroups.quota_cores). Slots and ranks split these, so jobs side by side share
    the quota instead of each taking all of it."""
    cpus = usable_cpus()
    quota = cgroups.quota_cores()
    return cpus[:quota] if quota is not None else cpus


def cpu_share(cpus: list[int] | tuple[int, ...] | None = None) -> dict[str, object]:
    """The cores a job was given (``cpus``; default this process's affinity mask: a launcher slot,
    a container, or SLURM where it binds tasks) and how many of them it may use: fewer where
    SLURM_CPUS_PER_TASK says so (SLURM without task binding leaves the mask whole but allots only
    those), or the cgroup's CPU quota allows fewer (a container's ``--cpus``, a pod's limit)."""
    cpus = list(cpus) if cpus else usable_cpus()
    allotted = len(cpus)
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit():
        allotted = min(allotted, int(slurm))
    quota = cgroups.quota_cores()
    if quota is not None:
        allotted = min(allotted, quota)
    return {"cpu_affinity": cpu_list(cpus)[:255], "cpus_allotted": allotted}  # the column's length


def default_threads() -> int | None:
    """The torch threads of a job whose ``threads`` is null: its allotted CPUs (:func:`cpu_share`)
    where those are fewer than the machine's cores, else None (torch's default, a thread per
    core). The job sets it; the sweep measures the CPU's matmul peak with the same count."""
    allotted = cpu_share()["cpus_allotted"]
    return allotted if isinstance(allotted, int) and allotted < (os.cpu_count() or allotted) else None


def slurm_job_id() -> str | None:
    """The SLURM job this process runs in (an array task as ``JOBID_TASK``), else None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


@functools.cache
def torch_build() -> dict[str, str | None]:
    """The installed torch's ``__version__``, ``cuda`` and ``hip`` as its ``torch/version.py``
    writes them, read without importing torch (which costs the sweep's process 1 to 2 s on a
    2-core CPU); {} where that file cannot be found or read (then ask torch itself)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    return read_torch_build(Path(next(iter(spec.submodule_search_locations))) / "version.py")


def read_torch_build(version_py: Path) -> dict[str, str | None]:
    """:func:`torch_build` from the file ``version_py``: its literal assignments (plain or
    annotated) to ``__version__``, ``cuda`` and ``hip``; {} where one is missing or not a literal."""
    try:
        tree = ast.parse(version_py.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, str | None] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) else target
        if isinstance(target, ast.Name) and target.id in ("__version__", "cuda", "hip") and node.value is not None:
            try:
                found[target.id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):  # not a literal (a torch computing it): ask torch
                return {}
    return found if {"__version__", "cuda", "hip"} <= set(found) else {}


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, answered without importing torch where the answer is
    certain: a torch built with neither CUDA nor ROCm sees no GPU on any machine. Only a GPU
    build is asked (it imports torch: what it sees depends on the driver and the devices)."""
    build = torch_build()
    if build and build["cuda"] is None and build["hip"] is None:
        return False
    import torch

    return torch.cuda.is_available()


def torch_version() -> str:
    """The installed torch's version, as ``torch.__version__`` says it (torch-free where it can be)."""
    if version := torch_build().get("__version__"):
        return version
    import torch

    return torch.__version__


def wants_cuda(requested: Device) -> bool:
    """Whether a job asking for ``requested`` runs on CUDA here, without opening a CUDA context."""
    return requested == Device.cuda or (requested == Device.auto and cuda_available())


def visible_gpus() -> list[str]:
    """GPUs a job started from here could see, without a CUDA context: ``CUDA_VISIBLE_DEVICES``
    when set, else NVML's device count (through torch, which does not initialise CUDA for it)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        visible = []
        for g in (g.strip() for g in env.split(",")):
            if not g or g.startswith("-"):
                break  # CUDA ignores everything from the first invalid entry on
            visible.append(g)
        return visible
    if not cuda_available():
        return []
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def plan(
    parallel: int, on_cuda: bool, nproc: int, gpus_per_job: int | None, cpus: list[int], gpus: list[str]
) -> list[Placement]:
    """The slots for ``parallel`` jobs of ``nproc`` ranks each; refuses (ConfigError, one line)
    a split that would leave a job without a GPU per rank or a core per rank."""
    if on_cuda:
        per_job = gpus_per_job or nproc
        n_slots = min(parallel, len(gpus) // per_job)
        if n_slots == 0:
            key = "launcher.gpus_per_job" if gpus_per_job else "nproc"
            raise ConfigError(
                f"invalid config: {key}={per_job}: each job needs {per_job} GPU(s) and this machine shows "
                f"{len(gpus)} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
            )
        if parallel == 1 and gpus_per_job is None and nproc == 1:
            return [Placement(0)]  # one job at a time: it sees the machine as it is
        gpu_slots = [tuple(gpus[k * per_job : (k + 1) * per_job]) for k in range(n_slots)]
    else:
        n_slots = parallel
        if len(cpus) // parallel < nproc:
            key, value = ("launcher.parallel", parallel) if parallel > 1 else ("nproc", nproc)
            quota, mask = cgroups.cpu_quota(), usable_cpus()
            if quota is not None and quota < len(mask):
                may = f"{len(cpus)} CPU(s) (cores {cpu_list(mask)}, limited by its cgroup's CPU quota of {quota:g})"
            else:
                may = f"{len(cpus)} ({cpu_list(cpus)})"
            raise ConfigError(
                f"invalid config: {key}={value}: {parallel} job(s) of {nproc} rank(s) need a CPU core per rank "
                f"and this process may use {may}; lower launcher.parallel or nproc"
            )
        if parallel == 1:
            return [Placement(0)]
        gpu_slots = [None] * n_slots
    if n_slots == 1:
        return [Placement(0, None, gpu_slots[0])]
    per_cpu = len(cpus) // n_slots
    return [Placement(k, tuple(cpus[k * per_cpu : (k + 1) * per_cpu]), gpu_slots[k]) for k in range(n_slots)]


class SlotPool:
    """Free slots. :meth:`acquire` blocks until one is free, so a job waits instead of sharing;
    the job's thread gives it back with :meth:`release` when the job has ended."""

    def __init__(self, placements: list[Placement]) -> None:
        self._free = list(placements)
        self._cond = threading.Condition()
        self.size = len(placements)

    def acquire(self) -> Placement:
        with self._cond:
            while not self._free:
                self._cond.wait(timeout=0.5)  # a timed wait: Ctrl-C reaches a waiting main thread
            return self._free.pop(0)

    def release(self, placement: Placement) -> None:
        with self._cond:
            self._free.append(placement)
            self._free.sort(key=lambda p: p.slot)
            self._cond.notify()
