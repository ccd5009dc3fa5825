"""torch.compile: applying it and reading back what Dynamo did.

Compile latency and steady-state speed are reported separately: ``compile_time_ms`` is the
first step minus the steady-state median, and the sweep fills ``compile_payback_steps``
(compile time over the per-step saving against the eager twin of the same config).
"""

from __future__ import annotations

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
        "n_recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0,
        "graph_break_reasons": breaks or None,
    }
