"""Where a number was measured: machine, software and source revision, for the runs table.

Imports torch only inside the functions that ask it: the sweep's own process reads the cgroup's
OOM kills and sets job environments from here, and it runs without torch (perfsweep.slots).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from perfsweep import cgroups, slots

if TYPE_CHECKING:
    import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""/proc/cpuinfo flags of bf16 arithmetic units: x86's AVX-512 BF16 and AMX, Arm's BF16 feature."""


def cpu_bf16_units(cpuinfo: str | None = None) -> list[str] | None:
    """The bf16 unit flags the CPU lists (:data:`BF16_FLAGS`; ``cpuinfo``: the text of
    /proc/cpuinfo), [] where it lists none, None where there is no list to read (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):  # x86, Arm
            listed = set(line.split(":", 1)[1].split())
            return [f for f in BF16_FLAGS if f in listed]
    return None


def oom_kills(root: Path | None = None) -> int | None:
    """How many processes of this process's memory cgroup the kernel's OOM killer has killed so
    far (cgroup v2 ``memory.events``, v1 ``memory.oom_control``: ``oom_kill N``), or None where
    the kernel does not say. A job that died of SIGKILL while it rose was killed for memory; one
    that died while it stayed was killed by someone else (``kill -9``, a scheduler)."""
    for folder in cgroups.group_dirs("memory", root):  # its own group's count first
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError, ValueError):
                for line in (folder / name).read_text().splitlines():
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
    return None


def sigkill_outcome(who: str, kills_before: int | None, kills_after: int | None) -> tuple[str, str, dict]:
    """(status, error, fields) of ``who`` ("job process", "rank 1") that died of SIGKILL, by its
    memory cgroup's OOM kill count before and after (:func:`oom_kills`): ``oom`` when the kernel's
    OOM killer struck while it ran, else ``failed`` naming the signal (and, when the count is
    unknown, the likely cause).

    The count is the cgroup's, not the process's: with jobs side by side (``launcher.parallel``) an
    OOM kill of one while another was killed by hand counts for both. Killers in user space
    (systemd-oomd, earlyoom) send SIGKILL without moving it: their kills read as "not the kernel's"."""
    if kills_before is not None and kills_after is not None and kills_after > kills_before:
        return (
            "oom",
            f"{who} killed by the kernel's OOM killer: memory ran out, the host's or the cgroup's limit (the "
            f"memory cgroup's OOM kill count rose by {kills_after - kills_before} while it ran); lower batch or "
            "seq_len, or run fewer jobs at once",
            {},
        )
    if kills_before is not None and kills_before == kills_after:
        return (
            "failed",
            f"{who} killed by SIGKILL, not by the kernel's OOM killer (the memory cgroup's OOM kill count did "
            "not change): another process, a user or a scheduler sent it",
            {},
        )
    return ("failed", f"{who} killed by SIGKILL (often the kernel's OOM killer; check dmesg)", {})


def git_state(path: str | Path) -> tuple[str | None, bool | None]:
    """(HEAD, dirty) of the git checkout at ``path`` (the launch directory); (None, None) outside
    one. ``dirty``: tracked files differ from HEAD (untracked files do not count)."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return head.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def nvidia_driver_version() -> str | None:
    """The kernel driver's version from /proc (Linux), without nvidia-smi or NVML."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


@contextlib.contextmanager
def environ_set(values: dict[str, str]) -> Iterator[None]:
    """Environment variables set for the duration of a block, then put back as they were (unset
    ones unset): how a compile cache or a launcher slot is handed to what runs inside."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def environment(device: torch.device, launch_dir: str | Path) -> dict[str, object]:
    """Everything known to change a run's numbers, read in the job process (so a setting made by
    the user's environment or code is what is recorded): the machine, the GPU and its driver,
    the math modes (TF32, cuDNN autotuning), the allocator setting, the software versions and
    the source revision."""
    import torch

    on_cuda = device.type == "cuda"
    commit, dirty = git_state(launch_dir)
    props = torch.cuda.get_device_properties(device) if on_cuda else None
    cudnn = torch.backends.cudnn.version() if on_cuda and torch.backends.cudnn.is_available() else None
    return {
        "hostname": socket.gethostname(),
        "device_type": device.type,
        "device_name": torch.cuda.get_device_name(device) if on_cuda else cpu_name(),
        "cpu_model": cpu_name(),
        "cpu_count": os.cpu_count(),
        **slots.cpu_share(),
        "cuda_visible_devices": (os.environ.get("CUDA_VISIBLE_DEVICES") or "")[:255] or None,  # the column's length
        "slurm_job_id": slots.slurm_job_id(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": str(torch.__version__),  # a str: torch's TorchVersion would import torch where it is unpickled
        "cuda_version": torch.version.cuda if on_cuda else None,
        "cudnn_version": str(cudnn) if cudnn else None,
        "gpu_driver_version": nvidia_driver_version() if on_cuda else None,
        "gpu_total_memory_bytes": props.total_memory if props is not None else None,
        "gpu_compute_capability": f"{props.major}.{props.minor}" if props is not None else None,
        "tf32_matmul": compute_dtype(False, "") == "tf32",
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"),
        "python_version": platform.python_version(),
        "git_commit": commit,
        "git_dirty": dirty,
    }


# Dense (not sparse) peaks in FLOP/s by the dtype the matmuls run in, for MFU. fp32 is the
# CUDA-core peak (torch's default: TF32 off for matmuls); tf32/bf16/fp16 are tensor-core peaks.
# Figures from NVIDIA's H100/H200 and A100 datasheets, whose tensor-core numbers are quoted with
# sparsity: halved here. Matched by substring of the device name, the longest match wins, so
# "H100 PCIe" and "H100 NVL" beat "H100" (SXM).
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12},  # SXM5
    "H100 PCIe": {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12},
    "H100 NVL": {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "H200": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12},  # SXM
    "H200 NVL": {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "GH200": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989e12, "fp16": 989e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
}

COMPUTE_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")


def compute_dtype(amp: bool, amp_dtype: str) -> str:
    """The dtype a run's matmuls execute in: the autocast dtype, else fp32 or TF32 as torch is set.

    Asked of torch in the job process, so TF32 switched on by the user (through
    ``torch.backends.cuda.matmul.allow_tf32`` or ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE``) is seen.
    """
    if amp:
        return amp_dtype
    import torch

    tf32 = torch.backends.cuda.matmul.allow_tf32 or os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1"
    return "tf32" if tf32 else "fp32"


def peak_flops(device_name: str | None, dtype: str) -> float | None:
    """Dense peak FLOP/s of ``device_name`` in ``dtype``; None for a device not in the table."""
    if not device_name:
        return None
    hits = [k for k in PEAK_FLOPS if k in device_name]
    return PEAK_FLOPS[max(hits, key=len)][dtype] if hits else None
