"""Memory probes: the peak bytes of live tensors a training step needs, on CUDA and CPU alike.

``peak_allocated_bytes`` (and ``peak_mem_bytes``, the headline figure) means the same on both:

- CUDA: ``max_memory_allocated`` over the measured steps, after ``reset_peak_memory_stats`` at
  the end of warmup.
- CPU has no allocator peak counter, so we count what the CPU allocator hands out: one extra
  step after the measured ones runs under torch.profiler with ``profile_memory``, and the
  running sum of its allocation and free events gives the step's peak above what was live
  before it; adding the parameters and optimizer state (live across steps) gives the peak.

The process view is kept too: RSS just before the first step, its peak over the measured
steps (Linux VmHWM, reset by writing 5 to /proc/self/clear_refs at the end of warmup) and
the growth between them. RSS includes memory glibc keeps after tensors are freed, which
blurs differences such as checkpointing's saving, hence the allocator-based headline figure.
"""

from __future__ import annotations

import contextlib
import logging
import re
import resource
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from perfsweep import cgroups

log = logging.getLogger(__name__)


def _proc_kib(path: str, field: str) -> int | None:
    """A ``Field:  123 kB`` line of a /proc file, in KiB; None where there is no /proc (macOS)."""
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path(path).read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _status_kib(field: str) -> int | None:
    return _proc_kib("/proc/self/status", field)


def current_rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    # macOS: no /proc; ru_maxrss is the best we have (bytes there, KiB on Linux)
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def current_vm_bytes() -> int:
    """The process's address-space size (VmSize), what RLIMIT_AS limits; 0 where unknown."""
    kib = _status_kib("VmSize")
    return kib * 1024 if kib is not None else 0


_limit_base: tuple[int, int] | None = None
"""(VmSize, VmPeak) when :func:`limit_address_space` set this process's limit."""


def limit_address_space(extra_bytes: int) -> None:
    """Cap this process's address space at its present size plus ``extra_bytes`` (RLIMIT_AS, what
    ``ulimit -v`` sets), so an allocation past it fails as torch's CPU out-of-memory error; the
    size and peak at this moment are kept for :func:`limit_used_bytes`."""
    global _limit_base
    size, peak = current_vm_bytes(), (_status_kib("VmPeak") or 0) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + extra_bytes, resource.getrlimit(resource.RLIMIT_AS)[1]))
    _limit_base = (size, peak)


def limit_used_bytes() -> int | None:
    """How much of :func:`limit_address_space`'s limit the process has used at its peak so far:
    its address-space peak (VmPeak) above its size when the limit was set. This is what an
    allocation past the limit runs into, thread stacks and malloc's unreturned memory included, so
    batch=max calibrates its next try with it (the ledger counts tensors alone). None without a
    limit, without /proc, or while the peak is one from before the limit (the process had shrunk
    by then, and what it used since is not known)."""
    if _limit_base is None or (peak_kib := _status_kib("VmPeak")) is None:
        return None
    size, peak_then = _limit_base
    if peak_then > size and peak_kib * 1024 <= peak_then:
        return None
    return peak_kib * 1024 - size


def peak_rss_bytes() -> int:
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    return current_rss_bytes()


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _cgroup_free_bytes() -> int | None:
    """The least of memory.max - memory.current over this process's cgroup and its ancestors (v2),
    None where none is limited or there is none."""
    headroom = []
    for folder in cgroups.group_dirs("memory"):
        with contextlib.suppress(OSError, ValueError):
            limit = (folder / "memory.max").read_text().strip()
            if limit != "max":
                headroom.append(int(limit) - int((folder / "memory.current").read_text()))
    return min(headroom) if headroom else None


def free_bytes(device: torch.device) -> int | None:
    """Memory a job on ``device`` can still take: CUDA's free bytes on the device; on the CPU the
    least of MemAvailable, the cgroup's headroom and the address-space limit's (RLIMIT_AS, what
    ``ulimit -v`` sets). None where nothing can be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    candidates: list[int] = []
    if (kib := _proc_kib("/proc/meminfo", "MemAvailable")) is not None:
        candidates.append(kib * 1024)
    if (cgroup := _cgroup_free_bytes()) is not None:
        candidates.append(cgroup)
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and (vm := _status_kib("VmSize")) is not None:
        candidates.append(soft - vm * 1024)
    return min(candidates) if candidates else None


class MemoryProbe:
    """Takes the baseline before training and the peaks of the measured window."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rss_before_train = 0
        self.peak_reset_ok = False

    def before_training(self) -> None:
        self.rss_before_train = current_rss_bytes()

    def start_measure(self) -> None:
        """Called after the last warmup step: peaks from here on exclude warmup."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_reset_ok = reset_peak_rss()
        if not self.peak_reset_ok:
            log.warning("cannot reset peak RSS here; peak_rss_bytes is the process lifetime peak")

    def result(self) -> dict[str, int | None]:
        peak_rss = peak_rss_bytes()
        out: dict[str, int | None] = {
            "rss_before_train_bytes": self.rss_before_train,
            "peak_rss_bytes": peak_rss,
            "rss_growth_bytes": max(0, peak_rss - self.rss_before_train),
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
            "peak_active_bytes": None,
            "num_alloc_retries": None,
            "num_ooms": None,
        }
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)
            out.update(
                peak_allocated_bytes=torch.cuda.max_memory_allocated(self.device),
                peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device),
                peak_active_bytes=stats.get("active_bytes.all.peak"),
                num_alloc_retries=stats.get("num_alloc_retries"),
                num_ooms=stats.get("num_ooms"),
            )
            out["peak_mem_bytes"] = out["peak_allocated_bytes"]
        return out


def persistent_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes that stay live between steps: parameters and optimizer state (gradients are freed)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(
        v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)
    )
    return params + state


def step_alloc_peak_bytes(run_step: Callable[[], object]) -> int:
    """Peak live bytes the CPU allocator handed out during one ``run_step()``, above the start.

    Uses torch.profiler's memory events (alloc: +bytes, free: -bytes), summed in time order.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run_step()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def map_profiler() -> None:
    """Use the CPU memory profiler once, over a trivial op, so the libraries it maps on first use
    are part of the size :func:`limit_address_space` starts from. Mapped after it, they came out
    of ``job_memory_limit_mib``, though no training tensor lives in them: 79 MiB of address space
    on this project's CPU build (torch 2.13; tests/test_search.py), about half the non-tensor use
    that batch=max searches found under a 300 MiB limit (134-144 MiB before, 61-74 after). On an
    H100 machine's CUDA build (torch 2.11) every CPU try under that limit ran out of memory, those
    whose output survives just after their memory step; whether this probe or the matmul-peak one
    after it (perfsweep.runner.cpu_matmul_peak) took the address space there is not known."""
    step_alloc_peak_bytes(lambda: torch.ones(16).sum())


class MemorySnapshot:
    """CUDA allocator history for pytorch.org/memory_viz, plus a dump at the moment of an OOM.

    Recording starts when the job starts, so an OOM in the warmup steps (where most happen: the
    first step allocates everything) dumps a snapshot with the full history of how memory got
    there. Recording is switched off over the measured steps, because recording a stack on every
    allocation costs host time on every step, and on again for the profiled window, after which
    :meth:`dump` writes the pickle: its event trace covers the profiled steps. Switching off
    clears torch's event trace (the allocator drops it), so an OOM inside the measured steps
    dumps the live blocks, with the stacks recorded when they were allocated, but no events.

    ``context="alloc"`` records a stack when a block is allocated, not when it is freed.
    torch's default, ``"all"``, fails every step of a model with activation checkpointing and
    dropout on CUDA (torch 2.11: ``SystemError: ... returned NULL without setting an
    exception``; "alloc" and "state" work, measured on an H100), and memory_viz needs only the
    allocation stacks. The OOM observer is the one Megatron-LM installs: the allocator calls it
    before raising.
    """

    CONTEXT = "alloc"

    def __init__(self, out_dir: Path, label: str, max_entries: int) -> None:
        self.out_dir = out_dir
        self.label = label
        self.max_entries = max_entries
        self.oom_path: Path | None = None

    def start(self) -> None:
        self.resume()

        def on_oom(device, alloc, device_alloc, device_free) -> None:  # noqa: ARG001
            path = self.out_dir / f"memory_snapshot_oom_{self.label}.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            self.oom_path = path
            log.error("CUDA OOM: allocator snapshot written to %s", path)

        torch._C._cuda_attach_out_of_memory_observer(on_oom)

    def resume(self) -> None:
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries, context=self.CONTEXT, stacks="python")

    def pause(self) -> None:
        """Stop recording while steps are timed; torch clears the event trace recorded so far."""
        torch.cuda.memory._record_memory_history(enabled=None)

    def dump(self) -> Path:
        path = self.out_dir / f"memory_snapshot_{self.label}.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        self.pause()
        return path
