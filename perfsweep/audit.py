"""The numerics audit: did a fast setting change the training? Run at the end of every sweep.

Every ok run with AMP, activation checkpointing or torch.compile on is compared step by step
with its twin: the sweep's ok run with the same settings, seed and data but all three off (FP32
eager), the same repeat where there is one. Both runs see the same batches in the same order
(the data order is seeded), so step k of one is step k of the other, warmup included; the
comparison runs over the steps both stored. A step is out of tolerance when

    |loss - twin loss| > tolerance x |twin loss|,   or the loss is not finite where the twin's is,

with the tolerance of the run's compute dtype (:data:`perfsweep.names.LOSS_TOLERANCE`). The first
such step is ``numerics_diverged_step`` and the run gets ``numerics_warning``; so does an fp16 run
whose GradScaler skipped steps after warmup (overflowing gradients in the measured steps), and
any run, the FP32-eager reference included, whose loss was NaN or infinite at a measured step
(``nonfinite_loss_steps``): a training that blew up, whose speed is not that of one that works.
Checkpointing replays dropout's RNG, so with the same seed it must match its twin exactly.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from perfsweep import store
from perfsweep.names import HASHED_UNLESS_DEFAULT, LOSS_TOLERANCE, NOT_MEASURED

SWITCHES = ("amp", "ckpt", "compile")
"""What the audit checks: the settings that should leave the loss as FP32 eager has it."""
NOT_NUMERICS = (
    *SWITCHES,
    "amp_dtype",
    "grad_scaler_init_scale",
    "compile_backend",
    "compile_mode",
    "compile_cache",
    "timing",
    "profile",
    "steps",
)
"""Config keys that do not change which batches a step sees or what it should compute: left out
when looking for the twin (the steps compared are those both runs have)."""


def twin_key(config: dict[str, Any]) -> str:
    """What a run and its FP32-eager twin share."""
    return json.dumps(
        {
            k: v
            for k, v in config.items()
            if k not in NOT_NUMERICS
            and k not in NOT_MEASURED
            and not (k in HASHED_UNLESS_DEFAULT and v == HASHED_UNLESS_DEFAULT[k])  # older rows lack the key
        },
        sort_keys=True,
    )


def tolerance(amp: bool, amp_dtype: str) -> float:
    return LOSS_TOLERANCE[amp_dtype if amp else "fp32"]


def first_divergence(losses: dict[int, float], twin: dict[int, float], tol: float) -> tuple[int | None, float | None]:
    """(first step out of tolerance or None, the largest relative difference) over the common steps."""
    worst, diverged = None, None
    for step in sorted(losses.keys() & twin.keys()):
        a, b = losses[step], twin[step]
        if b is None or not math.isfinite(b):
            continue  # the twin blew up there: nothing to compare with (its own count flags it)
        # a NULL loss was stored for a NaN one (perfsweep.store.Real): every step has a loss
        rel = abs(a - b) / max(abs(b), 1e-12) if a is not None and math.isfinite(a) else math.inf
        worst = rel if worst is None else max(worst, rel)
        if diverged is None and rel > tol:
            diverged = step
    return diverged, worst


def audit_sweep(engine: Engine, sweep_id: int) -> int:
    """Fill the numerics columns of the sweep's ok runs; returns how many runs got a warning."""
    Run, Step = store.Run, store.Step
    with store.session(engine) as s:
        runs = s.scalars(select(Run).where(Run.sweep_id == sweep_id, Run.status == "ok")).all()
        twins: dict[str, list[store.Run]] = defaultdict(list)
        for r in runs:
            if not (r.amp or r.ckpt or r.compile):
                twins[twin_key(r.config_json)].append(r)
        wanted = [
            r for r in runs if r.amp or r.ckpt or r.compile or r.grad_scaler_skipped_steps or r.nonfinite_loss_steps
        ]
        pairs = {}
        for r in wanted:
            candidates = twins.get(twin_key(r.config_json), [])
            same_repeat = [t for t in candidates if t.repeat_index == r.repeat_index]
            pairs[r.id] = (same_repeat or candidates or [None])[0]
        ids = {r.id for r in wanted} | {t.id for t in pairs.values() if t is not None}
        losses: dict[int, dict[int, float]] = defaultdict(dict)
        for run_id, step, loss in s.execute(select(Step.run_id, Step.step, Step.loss).where(Step.run_id.in_(ids))):
            losses[run_id][step] = loss
        warned = 0
        for r in wanted:
            twin = pairs[r.id]
            diverged = worst = None
            if twin is not None and (r.amp or r.ckpt or r.compile):
                diverged, worst = first_divergence(losses[r.id], losses[twin.id], tolerance(r.amp, r.amp_dtype))
                r.numerics_twin_run_id, r.loss_max_rel_diff, r.numerics_diverged_step = twin.id, worst, diverged
            warn = diverged is not None or bool(r.grad_scaler_skipped_steps) or bool(r.nonfinite_loss_steps)
            if twin is not None or r.grad_scaler_skipped_steps or r.nonfinite_loss_steps:
                r.numerics_warning = warn
            warned += warn
    return warned
