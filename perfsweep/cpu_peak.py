"""The CPU's achievable matmul FLOP/s, the denominator of CPU utilisation: measured per sweep and per job.

A CPU has no published dense peak the way a GPU has, and what it can reach depends on its
vector units, its clock under load and the threads torch uses. So before a CPU sweep's jobs
start, perfsweep times square matmuls in fp32 and bf16 with the jobs' thread count and keeps
the best rate; runs then report ``cpu_flops_utilisation`` as their model FLOP/s over it,
labelled "of measured matmul peak", never as MFU. Each CPU job also times them after its measured
steps, in its compute dtype, and the best of the sweep's rate and its jobs' is the denominator of
every run of that dtype and thread count (perfsweep.summary.fill_cpu_utilisation).
"""

from __future__ import annotations

import time

MAX_SIZE = 1024
"""Largest matrix side: enough for the BLAS kernels' steady state."""
CALL_BUDGET_S = 0.02
"""The side doubles from 256 while one product takes less than this, so a CPU without native bf16
is measured at a size it finishes quickly. Not smaller: on this VM bf16 reached 12 GFLOP/s at side
512 and 19 at 1024, the size of the model's own products (batch x seq_len = 1024 rows)."""


RUN_SECONDS = 0.1
"""How long a CPU job times matmuls after its measured steps (``runs.cpu_matmul_flops``): taken at
the load its steps met, that rate keeps a run's utilisation at or under 1 when other work slowed
the sweep's own measurement before the jobs (1.26 was stored so, beside another test run)."""

MIN_CALLS = 5
"""Fewest timed products the best is taken from, however long they take: the best of one or two
calls let a moment of contention lower the peak until a run's utilisation read above 1."""


def matmul_flops(dtype_name: str, threads: int | None = None, seconds: float = 0.2) -> float:
    """Best FLOP/s of square matmuls in ``dtype_name`` (fp32 or bf16) over about ``seconds``, and
    over at least :data:`MIN_CALLS` products."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)

        def timed(a: torch.Tensor, b: torch.Tensor) -> float:
            """One product through the path an nn.Linear takes (F.linear: oneDNN on CPU), which is
            where a GPT's FLOPs are. torch.mm's BLAS path can be far slower: on this VM bf16 ran at
            1.2 GFLOP/s through mm and 12-16 through linear (AMD EPYC, torch 2.13), and a peak
            taken from mm would have let utilisation exceed 1."""
            t0 = time.perf_counter()
            torch.nn.functional.linear(a, b)
            return time.perf_counter() - t0

        size = 256
        while True:
            a = torch.randn(size, size, generator=gen).to(dtype)
            b = torch.randn(size, size, generator=gen).to(dtype)
            timed(a, b)  # the first calls pick kernels and fault in pages
            if size >= MAX_SIZE or timed(a, b) >= CALL_BUDGET_S:
                break
            size *= 2
        rates: list[float] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(rates) < MIN_CALLS:
            rates.append(2.0 * size**3 / timed(a, b))
        return max(rates)
    finally:
        torch.set_num_threads(before)


def sweep_fields(threads: int | None, dtypes: set[str] = frozenset({"fp32", "bf16"})) -> dict[str, float | int]:
    """The ``sweeps`` columns of a CPU sweep: the matmul peaks in ``dtypes`` (fp32, bf16; the
    others stay null: bf16 products take ~0.7 s where the CPU lacks bf16 units, wasted on a sweep
    without AMP) and the thread count they were measured with (``threads``, or torch's default as
    the jobs will get it)."""
    import torch

    return {
        **{f"cpu_matmul_{d}_flops": matmul_flops(d, threads) for d in ("fp32", "bf16") if d in dtypes},
        "cpu_matmul_threads": threads or torch.get_num_threads(),
    }
