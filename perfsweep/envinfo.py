"""Where a number was measured: machine, software and source revision, for the runs table."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(path: str | Path) -> str | None:
    """HEAD of the git checkout at ``path`` (the launch directory), with -dirty if modified."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device, launch_dir: str | Path) -> dict[str, object]:
    on_cuda = device.type == "cuda"
    return {
        "hostname": socket.gethostname(),
        "device_type": device.type,
        "device_name": torch.cuda.get_device_name(device) if on_cuda else cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if on_cuda else None,
        "python_version": platform.python_version(),
        "git_commit": git_commit(launch_dir),
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
    tf32 = torch.backends.cuda.matmul.allow_tf32 or os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1"
    return "tf32" if tf32 else "fp32"


def peak_flops(device_name: str | None, dtype: str) -> float | None:
    """Dense peak FLOP/s of ``device_name`` in ``dtype``; None for a device not in the table."""
    if not device_name:
        return None
    hits = [k for k in PEAK_FLOPS if k in device_name]
    return PEAK_FLOPS[max(hits, key=len)][dtype] if hits else None
