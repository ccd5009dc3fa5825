"""Reading a torch.profiler Chrome trace: GPU time per stage, GPU busy time, kernel categories.

One analysis serves both perfsweep's own profiled window (:mod:`perfsweep.profiling` runs it on
the trace it has just written) and ``perfsweep trace FILE`` for any trace a user already has.
It needs no torch: the trace is JSON.

Attribution rule. A GPU kernel (or memcpy/memset) belongs to the stage whose CPU range contains
the kernel's *launch*: the ``cuda_runtime``/``cuda_driver`` event with the same ``correlation``
id, on whatever thread it ran. Autograd launches backward kernels from its own thread, outside
the main thread's ``record_function("backward")`` range, so the profiler's own parent/child
attribution gives backward no GPU time at all; matching by launch time inside the stage's wall
range gives every kernel a stage. A kernel belongs to the profiled step whose ``ProfilerStep#N``
range contains its launch, whenever it actually ran.

GPU busy time is the union of the kernel, memcpy and memset intervals of the profiled steps
(overlapping kernels on several streams count once), divided by the number of steps.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsweep.cli import first_line
from perfsweep.metrics import gpu_busy_fraction
from perfsweep.names import HOST_COLLECTIVE_PREFIXES, KERNEL_CATEGORIES, PROFILER_STEP_PREFIX, STAGES

GPU_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
"""Chrome-trace ``cat`` values of work that occupies the GPU."""

LAUNCH_EVENT_CATEGORIES = ("cuda_runtime", "cuda_driver")
"""CPU-side events that launch GPU work (cudaLaunchKernel, cuLaunchKernelEx for Triton, cudaMemcpyAsync...)."""

RANGE_EVENT_CATEGORIES = ("user_annotation", "cpu_op")
"""Categories under which record_function ranges appear (user_annotation since torch 1.13)."""

STEP_WORK_CATEGORIES = (*RANGE_EVENT_CATEGORIES, *LAUNCH_EVENT_CATEGORIES)
"""Events that make a ``ProfilerStep#N`` range a step: an operator, a range, a launch. Not
``python_function`` (``with_stack=True``): the profiler's own exit leaves its frames in the
empty range after a loop's last ``prof.step()``."""

KERNEL_RULES: tuple[tuple[str, str], ...] = (
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|c10d|gloo"),
    ("attention", r"flash|fmha|sdpa|attention|attn|compute_dot_do_o|convert_dq_to_16bits"),
    ("optimizer", r"multi_tensor_apply|fused_?adam|adamw?_|amp_update_scale|non_finite_check"),
    ("gemm", r"^triton_tem_"),
    ("elementwise/norm", r"layer_?norm|rms_?norm|batch_?norm|group_?norm|GammaBeta"),
    ("elementwise/norm", r"^triton_poi_"),
    ("reduction", r"^triton_(red|per)_"),
    ("gemm", r"gemm|gemv|nvjet|cublas|xmma|cutlass|wgmma|matmul|_mm_kernel|splitk"),
    ("other", r"sort"),
    ("reduction", r"reduce|softmax|nll_loss|cross_entropy|cub::|argmax|argmin"),
    (
        "elementwise/norm",
        r"elementwise|copy|fill|dropout|gelu|relu|silu|gather|scatter"
        r"|index|cat_?array|embedding|arange|philox|where|masked",
    ),
)
"""How a kernel's name gives its category: the first rule whose regex matches (case-insensitive)
wins; memcpy/memset are recognised by their event category, and what matches nothing is
``other``. Order matters: attention kernels are often CUTLASS (checked before ``gemm``); a norm
kernel is a norm kernel eager or compiled (Inductor's fused layer-norm backward,
``triton_per_fused_..._native_layer_norm_backward_*``, counted as a reduction, moved 3.35 ms per
step of the compiled gpt2 trace out of the category where eager's layer norm was); otherwise
Inductor names a fused kernel after everything in it, so its prefix decides (``triton_poi_``
pointwise, ``triton_red_``/``triton_per_`` reductions, ``triton_tem_`` GEMM templates); eager
norm kernels are counted with the elementwise ones. A sort (cub's radix sort, torch's bitonic and
radix sorts: an embedding's backward, topk) is ``other``, not a reduction with cub's reduce and
scan kernels. ``optimizer`` is every foreach kernel (``multi_tensor_apply``), wherever it is
launched: besides the optimizer's own, GradScaler's unscale and a foreach gradient clip, which run
before the step; the stage table says where each ran."""

_RULES = tuple((cat, re.compile(rx, re.IGNORECASE)) for cat, rx in KERNEL_RULES)


PERFSWEEP_TRACE_INFO = "perfsweepInfo"
"""Top-level key of what perfsweep writes into its own traces: ``measured_step_ms``, the median of
the job's measured (unprofiled) steps, which the busy share is taken of where no ``--step-ms`` is
given (so ``perfsweep trace`` on a job's trace gives the share the run stored)."""


class TraceError(ValueError):
    """A file perfsweep cannot analyse; the message is one line saying what and what to do."""


def kernel_category(name: str, event_cat: str = "kernel") -> str:
    """The category of one GPU event by :data:`KERNEL_RULES`."""
    if event_cat in ("gpu_memcpy", "gpu_memset") or name.startswith(("Memcpy", "Memset")):
        return "memcpy/memset"
    for category, rx in _RULES:
        if rx.search(name):
            return category
    return "other"


@dataclass
class KernelStat:
    """One kernel name's share of the profiled steps."""

    name: str
    category: str
    ms_per_step: float
    calls_per_step: float


@dataclass
class CategoryStat:
    ms_per_step: float = 0.0
    kernels_per_step: float = 0.0


@dataclass
class TraceAnalysis:
    """Per-step figures of one trace; every ``*_ms`` field is milliseconds per profiled step."""

    path: str
    steps: int
    """Profiled steps found (``ProfilerStep#N`` ranges); 1 for a trace without them (whole trace)."""
    step_markers: bool
    """Whether the trace had ``ProfilerStep#N`` ranges."""
    device_name: str | None
    step_wall_ms: float
    """Mean wall time of a profiled step (CPU range): slowed by the profiler, unlike measured steps."""
    stage_cpu_ms: dict[str, float]
    stage_gpu_ms: dict[str, float]
    stage_calls: dict[str, int]
    unattributed_gpu_ms: float
    """GPU time of kernels launched inside a step but outside every stage range."""
    gpu_kernel_ms: float
    """Sum of kernel, memcpy and memset durations (counts overlap on several streams twice)."""
    gpu_busy_ms: float
    """Union of those intervals: time the GPU had at least one thing running."""
    collective_ms: float | None = None
    """Time per step a collective (DDP's gradient allreduce) was running: the union of the
    communication kernels' intervals on a GPU, else of the host's collective ranges (gloo runs
    them on its own threads, ``gloo:all_reduce``); None when the trace has none."""
    categories: dict[str, CategoryStat] = field(default_factory=dict)
    top_kernels: list[KernelStat] = field(default_factory=list)
    empty_steps: int = 0
    """``ProfilerStep#N`` ranges left out because no event started in them (a loop that ended
    before the profiler's schedule did leaves one after its last ``prof.step()``)."""
    skipped_events: int = 0
    """Events without a usable time (missing, negative or non-finite ``ts``/``dur``), or whose
    process, thread or category is no number or name (a list): left out."""
    device: int | str | None = None
    """The GPU analysed (``args.device`` of its kernels); None in a trace without GPU work."""
    measured_step_ms: float | None = None
    """The job's measured step median, where perfsweep wrote it into the trace (PERFSWEEP_TRACE_INFO)."""
    host_pid: int | str | None = None
    """The process analysed, where the trace holds several (merged from one trace per process); None
    for a trace of one process."""

    def basis_ms(self, step_ms: float | None = None) -> tuple[float, str]:
        """The step the busy share is taken of, and what it is: ``step_ms`` (``--step-ms``), else the
        measured step perfsweep wrote into its trace, else the profiled (profiler-slowed) step."""
        if step_ms:
            return step_ms, "measured_step_ms"
        if self.measured_step_ms:
            return self.measured_step_ms, "measured_step_ms_in_trace"
        return self.step_wall_ms, "profiled_step_wall_ms"

    def busy_fraction(self, step_ms: float | None = None) -> float | None:
        """GPU busy time over :meth:`basis_ms`; None where that step has no length (a trace whose
        events all start at one instant)."""
        share = gpu_busy_fraction(self.gpu_busy_ms, self.basis_ms(step_ms)[0])
        return share if math.isfinite(share) else None

    def to_json(self, step_ms: float | None = None) -> dict[str, Any]:
        """One JSON-ready object; keys carry their units."""
        return {
            "trace": self.path,
            "device_name": self.device_name,
            "device": self.device,
            "host_pid": self.host_pid,
            "profiled_steps": self.steps,
            "step_markers": self.step_markers,
            "empty_profiler_steps_left_out": self.empty_steps,
            "events_without_time_left_out": self.skipped_events,
            "profiled_step_wall_ms": self.step_wall_ms,
            "stage_gpu_ms": self.stage_gpu_ms,
            "stage_cpu_ms": self.stage_cpu_ms,
            "unattributed_gpu_ms": self.unattributed_gpu_ms,
            "gpu_kernel_ms_per_step": self.gpu_kernel_ms,
            "gpu_busy_ms_per_step": self.gpu_busy_ms,
            "gpu_busy_fraction": self.busy_fraction(step_ms),
            "gpu_busy_fraction_basis": self.basis_ms(step_ms)[1],
            "measured_step_ms": step_ms or self.measured_step_ms,
            "kernel_categories": {
                c: {"ms_per_step": s.ms_per_step, "kernels_per_step": s.kernels_per_step}
                for c, s in self.categories.items()
            },
            "top_kernels": [
                {
                    "name": k.name,
                    "category": k.category,
                    "ms_per_step": k.ms_per_step,
                    "calls_per_step": k.calls_per_step,
                }
                for k in self.top_kernels
            ],
        }


def load_events(path: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    """The trace's events, its top-level metadata and the file read (a job folder's one trace);
    TraceError with one line if unreadable."""
    p = Path(path)
    if p.is_dir():  # a perfsweep job folder: its one trace
        found = sorted(p.glob("trace_*.json.gz")) or sorted(p.glob("*.pt.trace.json*"))
        if len(found) != 1:
            raise TraceError(f"{p}: a folder with {len(found)} traces; pass one trace file")
        p = found[0]
    if not p.exists():
        raise TraceError(f"{p}: no such file; pass a Chrome trace (.json or .json.gz) written by torch.profiler")
    if not p.is_file():
        raise TraceError(f"{p}: not a regular file; pass a Chrome trace (.json or .json.gz) written by torch.profiler")
    try:
        with p.open("rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(p, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, zlib.error) as exc:  # zlib: damaged gzip
        raise TraceError(f"{p}: not a JSON trace ({type(exc).__name__}: {first_line(exc, 80)})") from None
    except RecursionError:  # JSON nested thousands deep: no trace is
        raise TraceError(f"{p}: not a trace (JSON nested too deep to read)") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{p}: JSON without a traceEvents list; is this a Chrome trace from torch.profiler?")
    meta = data if isinstance(data, dict) else {}
    return events, meta, p


def _arg(e: dict[str, Any], key: str) -> Any:
    args = e.get("args")
    return args.get(key) if isinstance(args, dict) else None


def _correlation(e: dict[str, Any]) -> int | str | None:
    corr = _arg(e, "correlation")
    return corr if isinstance(corr, int | str) else None


class _Ranges:
    """Time ranges with a label; looks up the innermost range containing a timestamp."""

    def __init__(self, ranges: list[tuple[float, float, str]]) -> None:
        self.ranges = sorted(ranges)
        self.starts = [r[0] for r in self.ranges]
        self.max_len = max((r[1] - r[0] for r in self.ranges), default=0.0)

    def find(self, ts: float) -> int | None:
        """Index of the latest-starting range that contains ``ts`` (ranges may nest)."""
        i = bisect.bisect_right(self.starts, ts) - 1
        while i >= 0 and self.starts[i] >= ts - self.max_len:
            start, end, _ = self.ranges[i]
            if start <= ts <= end:
                return i
            i -= 1
        return None


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, duration)`` intervals. A trace's timestamps are
    microseconds from an origin far back (about 1e12 on CUDA), where a double keeps only a few
    nanoseconds: ``(start + dur) - start`` is not ``dur``, and on the H100 traces in
    tests/fixtures/h100 the union came out above the sum of the kernels' own durations. So each
    merged block's length is built from durations and from differences of nearby starts, which
    are exact between doubles of one magnitude."""
    total = 0.0
    block_start: float | None = None
    block_len = 0.0
    for start, dur in sorted(intervals):
        offset = 0.0 if block_start is None else start - block_start
        if block_start is None or offset > block_len:
            total += block_len
            block_start, block_len = start, dur
        else:
            block_len = max(block_len, offset + dur)
    return total + block_len


def _device_of(e: dict[str, Any]) -> int | str | None:
    """The GPU one event ran on: its ``args.device``, a digit string read as the index it is;
    None where the event does not say."""
    d = _arg(e, "device")
    if isinstance(d, str) and d.strip().isdigit():
        return int(d)
    return d if isinstance(d, int | str) and not isinstance(d, bool) else None


def _devices(gpu_events: list[dict[str, Any]]) -> list[int | str]:
    """The GPUs the events name (an event that names none goes with whichever is analysed)."""
    return sorted({d for e in gpu_events if (d := _device_of(e)) is not None}, key=str)


def _device_name(meta: dict[str, Any], device: int | str | None) -> str | None:
    """``device``'s name from the trace's deviceProperties (their first entry where none has its id)."""
    props = meta.get("deviceProperties")
    entries = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    entry = next((p for p in entries if p.get("id") == device), entries[0] if entries else {})
    name = entry.get("name")
    return name if isinstance(name, str) else None


def _measured_step_ms(meta: dict[str, Any]) -> float | None:
    info = meta.get(PERFSWEEP_TRACE_INFO)
    value = info.get("measured_step_ms") if isinstance(info, dict) else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


def _driving_process(
    path: Path,
    device: int | str | None,
    gpu_events: list[dict[str, Any]],
    launches: dict[Any, list[tuple[float, Any, Any]]],
    step_pids: set[Any],
) -> Any:
    """The process whose host events go with the analysed GPU's work, where a trace holds several
    (torch.profiler writes a trace per process; a merged one holds each process's steps, and its
    ``ProfilerStep#N`` ranges counted together divided every figure by the number of processes);
    None for a trace of one process. The process is the one whose launches the GPU's kernels
    match; a TraceError where that cannot be told: correlation ids restart in each process, so in a
    merged trace one id may name a launch in several."""
    pids = {x[2] for found in launches.values() for x in found} | step_pids
    if len(pids) <= 1:
        return None
    owners: set[Any] = set()
    shared = 0
    for e in gpu_events:
        found = {x[2] for x in launches.get(_correlation(e), ())}
        shared += len(found) > 1
        owners |= found
    procs = f"events of {len(pids)} processes (pids {', '.join(sorted(map(str, pids)))})"
    gpu = f"device {device}" if device is not None else "the GPU"
    fix = "analyse each process's own trace (torch.profiler writes one per process)"
    if shared:
        raise TraceError(
            f"{path}: {procs} whose launches share correlation ids ({shared} of {gpu}'s kernels match a launch "
            f"in more than one), so which process launched a kernel cannot be told; {fix}"
        )
    if len(owners) != 1:
        by = f"launched by pids {', '.join(sorted(map(str, owners)))}" if owners else "matched to no launch"
        raise TraceError(f"{path}: {procs}, and {gpu}'s kernels were {by}; {fix}")
    return owners.pop()


def _calls(ranges: list[tuple[float, float, str, Any]]) -> dict[str, list[tuple[float, float, float]]]:
    """Each stage's calls, thread by thread, as (start, end, CPU µs): a range inside one of the same
    name on the same thread (a recursive ``record_function``) is part of it, not a second call;
    one that starts inside and ends after (two calls whose edges meet, as rounded) is a call whose
    time starts where the one before ended, so no microsecond counts twice."""
    out: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    by_key: dict[tuple[str, Any], list[tuple[float, float]]] = defaultdict(list)
    for start, end, name, tid in ranges:
        by_key[(name, tid)].append((start, end))
    for (name, _), spans in by_key.items():
        cur_end = float("-inf")
        for start, end in sorted(spans):
            if end <= cur_end:
                continue  # nested
            out[name].append((start, end, end - max(start, cur_end)))
            cur_end = end
    return out


def analyze(
    path: str | Path,
    stages: tuple[str, ...] | list[str] = STAGES,
    top_n: int = 15,
    require_gpu: bool = True,
    device: int | None = None,
) -> TraceAnalysis:
    """Analyse one Chrome trace. ``require_gpu``: a trace without GPU events is a TraceError.
    ``device``: the GPU to analyse where the trace holds work on several (one GPU's busy time is
    not a union over GPUs); None: the one GPU there is, and a TraceError where there are several."""
    events, meta, path = load_events(path)
    stage_set = set(stages)
    # host-side events keep their process (pid): a trace merged from several processes holds each one's
    step_ranges: list[tuple[float, float, str, Any]] = []
    stage_ranges: list[tuple[float, float, str, Any, Any]] = []
    launches: dict[Any, list[tuple[float, Any, Any]]] = defaultdict(list)
    gpu_events: list[dict[str, Any]] = []
    host_collectives: list[tuple[float, float, Any]] = []
    host_starts: list[tuple[float, Any]] = []  # operators', ranges' and launches' starts: which steps hold work
    skipped = 0
    t_min, t_max = float("inf"), float("-inf")
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), e.get("name")
        if not isinstance(name, str):
            name = e["name"] = ""  # a malformed event; our parsed copy only
        if not all(isinstance(e.get(k), int | float | str | None) for k in ("cat", "pid", "tid")):
            skipped += 1  # a list for a process or thread (a fuzzer's): it cannot be grouped by
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            skipped += 1
            continue
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:  # no time to count: not a guess
            skipped += 1
            continue
        if cat in GPU_EVENT_CATEGORIES:
            gpu_events.append(e)
        else:
            pid = e.get("pid")
            if cat in STEP_WORK_CATEGORIES and not name.startswith(PROFILER_STEP_PREFIX):
                host_starts.append((ts, pid))
            if cat in LAUNCH_EVENT_CATEGORIES:
                corr = _correlation(e)
                if corr is not None:
                    launches[corr].append((ts, e.get("tid"), pid))
            elif cat in RANGE_EVENT_CATEGORIES:
                if name.startswith(PROFILER_STEP_PREFIX):
                    step_ranges.append((ts, ts + dur, name, pid))
                elif name.startswith(HOST_COLLECTIVE_PREFIXES):
                    host_collectives.append((ts, ts + dur, pid))
                elif name in stage_set:
                    stage_ranges.append((ts, ts + dur, name, e.get("tid"), pid))
        if cat not in ("Trace",) and isinstance(e.get("pid"), int | str):
            t_min, t_max = min(t_min, ts), max(t_max, ts + dur)
    if require_gpu and not gpu_events:
        raise TraceError(
            f"{path}: no GPU kernels in this trace (CPU-only profile?); profile with "
            "ProfilerActivity.CUDA on a GPU run to get GPU time per stage"
        )
    devices = _devices(gpu_events)
    if device is not None and devices and device not in devices:
        raise TraceError(
            f"{path}: --device {device}: no GPU work on it; this trace has work on device(s) "
            + ", ".join(map(str, devices))
        )
    if device is None and len(devices) > 1:
        raise TraceError(
            f"{path}: GPU work on devices {', '.join(map(str, devices))}; pass --device N to analyse one "
            "(a union over several GPUs is not any GPU's busy time)"
        )
    chosen = device if device is not None else (devices[0] if devices else None)
    if len(devices) > 1:
        gpu_events = [e for e in gpu_events if _device_of(e) in (chosen, None)]
    pid = _driving_process(path, chosen, gpu_events, launches, {r[3] for r in step_ranges})
    if pid is not None:  # one process of several: its steps, ranges and launches alone
        step_ranges = [r for r in step_ranges if r[3] == pid]
        stage_ranges = [r for r in stage_ranges if r[4] == pid]
        host_collectives = [r for r in host_collectives if r[2] == pid]
        host_starts = [r for r in host_starts if r[1] == pid]
    first_launch: dict[Any, tuple[float, Any]] = {}  # correlation id -> (start, thread) of its launch
    for corr, found in launches.items():
        mine = [x for x in found if pid is None or x[2] == pid]
        if mine:
            first_launch[corr] = mine[0][:2]
    step_markers = bool(step_ranges)
    # a ProfilerStep range holding no operator, range or launch is no step: a loop that ends before
    # the profiler's schedule does leaves one (7 us, after the last prof.step()), which divided every figure
    starts = sorted(ts for ts, _ in host_starts)
    held = [r[:3] for r in step_ranges if bisect.bisect_right(starts, r[1]) > bisect.bisect_left(starts, r[0])]
    empty_steps = len(step_ranges) - len(held) if held else 0
    step_ranges = held or [r[:3] for r in step_ranges]
    if not step_markers:
        step_ranges = [(t_min, t_max, "whole trace")] if t_min <= t_max else [(0.0, 0.0, "whole trace")]
    steps = _Ranges(step_ranges)
    stage_ranges = [r[:4] for r in stage_ranges]
    any_thread = _Ranges([r[:3] for r in stage_ranges])
    by_thread: dict[Any, _Ranges] = {}
    for tid in {r[3] for r in stage_ranges}:
        by_thread[tid] = _Ranges([r[:3] for r in stage_ranges if r[3] == tid])
    n_steps = len(step_ranges)

    def stage_of(ts: float, tid: Any) -> str | None:
        """The stage whose range holds a launch at ``ts``: the launching thread's own innermost
        range, else any thread's (autograd's thread has none: backward's range is the main one's)."""
        for idx in (by_thread.get(tid), any_thread):
            i = idx.find(ts) if idx is not None else None
            if i is not None:
                return idx.ranges[i][2]
        return None

    stage_cpu_us: dict[str, float] = defaultdict(float)
    stage_calls: dict[str, int] = defaultdict(int)
    for name, calls in _calls(stage_ranges).items():
        for start, _, cpu_us in calls:
            if steps.find(start) is not None:
                stage_cpu_us[name] += cpu_us
                stage_calls[name] += 1

    stage_gpu_us: dict[str, float] = {s: 0.0 for s in stages}
    unattributed_us = 0.0
    kernel_us = 0.0
    intervals: list[tuple[float, float]] = []
    cat_us: dict[str, float] = defaultdict(float)
    cat_n: dict[str, int] = defaultdict(int)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    comm_intervals: list[tuple[float, float]] = []
    for e in gpu_events:
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        launch = first_launch.get(_correlation(e))
        anchor = launch[0] if launch is not None else ts
        if steps.find(anchor) is None:
            continue  # outside the profiled steps (e.g. the profiler's own flush)
        kernel_us += dur
        intervals.append((ts, dur))
        category = kernel_category(e.get("name", ""), e.get("cat", "kernel"))
        if category == "communication":
            comm_intervals.append((ts, dur))
        stage = stage_of(*launch) if launch is not None else None
        if stage is None:
            unattributed_us += dur
        else:
            stage_gpu_us[stage] += dur
        name = e.get("name", "")
        cat_us[category] += dur
        cat_n[category] += 1
        agg = by_name[name]
        agg[0] += dur
        agg[1] += 1

    per_step = 1000.0 * n_steps  # us totals -> ms per step
    top = sorted(by_name.items(), key=lambda kv: kv[1][0], reverse=True)[:top_n]
    step_wall_us = sum(end - start for start, end, _ in step_ranges)
    if not comm_intervals:  # no communication kernels: the host's collective ranges (gloo's threads)
        comm_intervals = [(a, b - a) for a, b, _ in host_collectives if steps.find(a) is not None]
    return TraceAnalysis(
        path=str(path),
        steps=n_steps,
        step_markers=step_markers,
        device_name=_device_name(meta, chosen),
        step_wall_ms=step_wall_us / per_step,
        stage_cpu_ms={s: stage_cpu_us[s] / per_step for s in stages if stage_calls.get(s)},
        stage_gpu_ms={s: stage_gpu_us[s] / per_step for s in stages},
        stage_calls={s: stage_calls[s] for s in stages if stage_calls.get(s)},
        unattributed_gpu_ms=unattributed_us / per_step,
        gpu_kernel_ms=kernel_us / per_step,
        gpu_busy_ms=_union_us(intervals) / per_step,
        collective_ms=_union_us(comm_intervals) / per_step if comm_intervals else None,
        categories={
            c: CategoryStat(cat_us[c] / per_step, cat_n[c] / n_steps) for c in KERNEL_CATEGORIES if cat_n.get(c)
        },
        top_kernels=[KernelStat(name, kernel_category(name), us / per_step, n / n_steps) for name, (us, n) in top],
        empty_steps=empty_steps,
        skipped_events=skipped,
        device=chosen,
        measured_step_ms=_measured_step_ms(meta),
        host_pid=pid,
    )


def short_kernel_name(name: str, width: int = 70) -> str:
    """A kernel name that fits a table: no ``void``, namespaces or parameter list; templates kept."""
    n = re.sub(r"\(anonymous namespace\)::|at::native::|\bvoid ", "", name)
    depth = 0
    for i, ch in enumerate(n):  # cut the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            n = n[:i]
            break
    n = n.strip() or name
    return n if len(n) <= width else n[: width - 3] + "..."


STEP_MS_RANGE = (1e-3, 1e7)
"""What ``--step-ms`` may be: a microsecond to almost three hours. A value outside it is no step
time (1e-300 printed a busy share of 10^298 %)."""

OVER_THE_STEP = {
    "measured_step_ms": "is --step-ms this trace's step time?",
    "measured_step_ms_in_trace": "is the measured step written in this trace its own run's?",
    "profiled_step_wall_ms": "the kernels ran on past the end of the host's profiled steps; give the "
    "measured step time with --step-ms",
}
"""What the warning of a busy share over 100% asks, by what the share was taken of
(:meth:`TraceAnalysis.basis_ms`)."""


def format_analysis(a: TraceAnalysis, step_ms: float | None = None) -> str:
    """The table ``perfsweep trace`` prints for people."""
    lines = [f"Trace: {a.path}"]
    where = f" on {a.device_name}" if a.device_name else ""
    if a.device is not None:
        where += f" (device {a.device})"
    if a.host_pid is not None:
        where += f", launched by process {a.host_pid} of several in the trace"
    steps = f"{a.steps} profiled step(s)" if a.step_markers else "no ProfilerStep# ranges: the whole trace as one step"
    if a.empty_steps:
        steps += f" ({a.empty_steps} empty ProfilerStep# range(s) left out)"
    lines.append(f"{steps}{where}; times are ms per step")
    lines.append("")
    lines.append(f"{'stage':<18}{'GPU ms':>10}{'CPU ms':>10}")
    for s, gpu in a.stage_gpu_ms.items():
        cpu = a.stage_cpu_ms.get(s)
        lines.append(f"{s:<18}{gpu:>10.2f}{(f'{cpu:.2f}' if cpu is not None else '-'):>10}")
    lines.append(f"{'(no stage)':<18}{a.unattributed_gpu_ms:>10.2f}{'':>10}")
    lines.append("")
    basis_ms, kind = a.basis_ms(step_ms)
    basis = {
        "measured_step_ms": f"measured step {basis_ms:.2f} ms",
        "measured_step_ms_in_trace": f"measured step {basis_ms:.2f} ms (the job's, in the trace)",
    }.get(kind, f"profiled step {basis_ms:.2f} ms (profiler-slowed)")
    share = a.busy_fraction(step_ms)
    of = f"{share:.0%} of the {basis}" if share is not None else f"share unknown: the {basis}"
    lines.append(f"GPU busy {a.gpu_busy_ms:.2f} ms per step = {of}")
    lines.append(f"GPU kernel time {a.gpu_kernel_ms:.2f} ms per step (sum; exceeds busy time when streams overlap)")
    if a.collective_ms is not None:
        lines.append(f"Collectives (e.g. DDP's allreduce) running {a.collective_ms:.2f} ms per step")
    lines.append("")
    lines.append(f"{'category':<18}{'ms/step':>10}{'share':>8}{'kernels/step':>14}")
    total = a.gpu_kernel_ms or 1.0
    for c, st in sorted(a.categories.items(), key=lambda kv: kv[1].ms_per_step, reverse=True):
        lines.append(f"{c:<18}{st.ms_per_step:>10.2f}{st.ms_per_step / total:>8.0%}{st.kernels_per_step:>14.0f}")
    if a.top_kernels:  # none with --top 0: no header over nothing
        lines.append("")
        lines.append(f"{'top kernels':<72}{'ms/step':>9}{'calls':>7}  category")
    for k in a.top_kernels:
        lines.append(f"{short_kernel_name(k.name):<72}{k.ms_per_step:>9.2f}{k.calls_per_step:>7.0f}  {k.category}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``perfsweep trace FILE``: the analysis for any torch.profiler Chrome trace."""
    import sys

    from perfsweep.cli import OneLineParser

    parser = OneLineParser(
        prog="perfsweep trace",
        description="GPU time per stage (kernels attributed by launch, backward included), GPU busy "
        "time, kernel categories and top kernels of a torch.profiler Chrome trace (.json or .json.gz).",
    )
    parser.add_argument("file", help="Chrome trace from torch.profiler (export_chrome_trace or perfsweep's job folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        help="comma-separated record_function range names to attribute GPU time to (default: %(default)s)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="measured (unprofiled) step time in ms; the busy fraction uses it instead of the "
        "profiler-slowed step (perfsweep stores it as runs.step_time_ms_median, and writes it into "
        "the traces it makes, which need no --step-ms)",
    )
    parser.add_argument("--top", type=int, default=15, help="top kernels to list (default: %(default)s)")
    parser.add_argument(
        "--device",
        type=int,
        default=None,
        help="the GPU to analyse (its index in the trace) where the trace holds work on several",
    )
    args = parser.parse_args(argv)
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    if not stages:
        parser.error(f"--stages={args.stages!r}: give at least one range name")
    if args.step_ms is not None and not STEP_MS_RANGE[0] <= args.step_ms <= STEP_MS_RANGE[1]:  # nan: not in it
        parser.error(
            f"--step-ms={args.step_ms:g}: must be a measured step time in milliseconds, "
            f"from {STEP_MS_RANGE[0]:g} to {STEP_MS_RANGE[1]:g}"
        )
    if args.top < 0:
        parser.error(f"--top={args.top}: must be >= 0")
    try:
        analysis = analyze(args.file, stages, top_n=args.top, device=args.device)
    except TraceError as exc:
        print(f"perfsweep trace: {exc}", file=sys.stderr)
        return 2
    missing = [s for s in stages if s not in analysis.stage_calls]
    if len(missing) == len(stages):
        print(
            f"perfsweep trace: none of the stage ranges {', '.join(stages)} is in the trace; all GPU time "
            "is under (no stage). Name your record_function ranges with --stages.",
            file=sys.stderr,
        )
    elif missing:
        print(
            f"perfsweep trace: no range named {', '.join(missing)} in the profiled steps: their GPU time reads 0 "
            "and what ran there is under another stage or (no stage). Name your ranges with --stages.",
            file=sys.stderr,
        )
    share = analysis.busy_fraction(args.step_ms)
    if share is not None and share > 1.0:
        basis_ms, kind = analysis.basis_ms(args.step_ms)
        print(
            f"perfsweep trace: the GPU is busy {analysis.gpu_busy_ms:.2f} ms per step, longer than the "
            f"{basis_ms:.2f} ms step its share is taken of ({share:.0%}); {OVER_THE_STEP[kind]}",
            file=sys.stderr,
        )
    if analysis.skipped_events:
        print(
            f"perfsweep trace: {analysis.skipped_events} event(s) without a usable time (missing, negative or "
            "not finite), or with a list for their process, thread or category, left out",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(analysis.to_json(args.step_ms), indent=2))
    else:
        print(format_analysis(analysis, args.step_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
