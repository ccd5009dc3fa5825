"""torch.compile: applying it and reading back what Dynamo did.

Compile latency and steady-state speed are reported separately: ``compile_time_ms`` is the
first step minus the steady-state median, and the sweep fills ``compile_payback_steps``
(compile time over the per-step saving against the eager twin of the same config).
"""

from __future__ import annotations

import re
from typing import Any

import torch


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
