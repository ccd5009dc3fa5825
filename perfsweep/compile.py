"""torch.compile: applying it and reading back what Dynamo did.

Compile latency and steady-state speed are reported separately: ``compile_time_ms`` is the
first step minus the steady-state median, and the sweep fills ``compile_payback_steps``
(compile time over the per-step saving against the eager twin of the same config).

Jobs are separate processes, but Inductor and Triton keep their caches on disk: a graph that
an earlier process compiled loads in seconds (3.4 s against 28.4 s cold for GPT-2 small on an
H100). By default each job therefore compiles into an empty cache of its own
(``compile_cache=isolated``), and ``compile_cache_hits`` records how many compiled graphs
were loaded from a cache instead, so a warm compile is visible in SQL.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from perfsweep.envinfo import environ_set

CACHE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
"""Environment variables that place Inductor's (FX graph, AOTAutograd, C++/Triton code) and
Triton's kernel caches, and the folder of each in an isolated cache."""


@contextlib.contextmanager
def cache_scope(mode: str, job_dir: Path) -> Iterator[None]:
    """With ``mode='isolated'``, point the compile caches at an empty folder in ``job_dir``.

    Must be entered before the first compile of the process (the job process is fresh). The
    folder is removed afterwards: it can hold hundreds of MB of kernels nobody will reuse.
    """
    if mode != "isolated":
        yield
        return
    root = job_dir / "compile_cache"
    shutil.rmtree(root, ignore_errors=True)
    try:
        with environ_set({var: str(root / folder) for var, folder in CACHE_ENV.items()}):
            yield
    finally:
        shutil.rmtree(root, ignore_errors=True)


def apply(model: torch.nn.Module, backend: str, mode: str | None) -> torch.nn.Module:
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, mode=mode)  # type: ignore[return-value]


def diagnostics() -> dict[str, Any]:
    """Graphs, graph breaks with reasons, and recompilations from Dynamo's counters."""
    from torch._dynamo.utils import counters

    breaks = {str(reason): int(n) for reason, n in counters["graph_break"].items()}
    return {
        "n_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "n_graph_breaks": int(sum(breaks.values())),
        "n_recompiles": count_recompiles(),
        "graph_break_reasons": breaks or None,
        # graphs loaded from Inductor's FX graph cache or AOTAutograd's cache instead of compiled
        "compile_cache_hits": int(counters["inductor"].get("fxgraph_cache_hit", 0))
        + int(counters["aot_autograd"].get("autograd_cache_hit", 0)),
    }


def count_recompiles() -> int:
    """Recompilations, from Dynamo's guard-failure log.

    A frame recompiles only when the guards of every cached entry fail, and its first entry
    (compile id ``N/0``) is always among them, so each recompilation leaves exactly one
    ``N/0:`` reason. Other reasons are the later entries failing in the same check.
    """
    from torch._dynamo.utils import guard_failures

    reasons = [str(r) for rs in guard_failures.values() for r in rs]
    return sum(1 for r in reasons if re.match(r"\d+/0:", r))
