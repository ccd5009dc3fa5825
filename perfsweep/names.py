"""perfsweep's shared vocabulary: stage names, kernel categories and verdict thresholds.

Imports nothing heavy (no torch, no pandas), so the CLI, the trace analysis, the store and the
report can all share these names without paying for torch at import time.
"""

from __future__ import annotations

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
