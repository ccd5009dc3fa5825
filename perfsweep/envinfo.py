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
        head = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
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


# Dense (not sparse) bf16 tensor-core peaks, FLOP/s, for MFU. Matched by substring of the
# device name; the longest match wins so "H100 PCIe" beats "H100".
PEAK_BF16_FLOPS: dict[str, float] = {
    "H100": 989e12,  # SXM
    "H100 PCIe": 756e12,
    "H200": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
}


def peak_bf16_flops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    hits = [k for k in PEAK_BF16_FLOPS if k in device_name]
    return PEAK_BF16_FLOPS[max(hits, key=len)] if hits else None
