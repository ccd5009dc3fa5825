"""``batch=max``: the largest batch a grid point trains at without running out of memory.

The memory ledger (perfsweep.ledger) predicts the largest fitting batch from the device's free
memory, as a job process sees it; real jobs then decide. From the prediction the search grows
(x1.25 once: the ledger is within a few percent on the runs we measured; then x2) until a job runs
out of memory, or shrinks (/1.25 once, then /2) until one trains, and then bisects between the largest ok and the
smallest oom batch until they are neighbours. Every try is an ordinary job of the sweep, stored
in ``runs`` with its status (oom rows included) and ``batch_search_id``; the outcome is a row of
``batch_searches`` with the figures of the run at the largest batch. A model without a ledger
starts at batch 1 and doubles. A try that ends neither ok nor oom (a timeout, a failure) ends
the search as ``failed``: its memory limit is then unknown.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, update

from perfsweep import store
from perfsweep.config import MAX_BATCH, PerfsweepConfig

log = logging.getLogger(__name__)

FIRST_GROWTH = 1.25
"""How far past the ledger's prediction the first step up goes (its error was within 6% on the
runs in docs/benchmarks.md); later steps double."""


@dataclass
class Outcome:
    """What a search found; ``tried`` is every (batch, status) in the order the jobs ran."""

    max_batch: int | None = None
    first_oom_batch: int | None = None
    capped: bool = False
    tried: list[tuple[int, str]] = field(default_factory=list)
    status: str = "running"
    error: str | None = None

    @property
    def exit_status(self) -> str:
        """The run status the search counts as for the sweep's exit code: its oom tries are the
        point of it, so a search that found its batch is ok."""
        return {"done": "ok", "none_fit": "oom"}.get(self.status, "failed")


def search(
    try_batch: Callable[[int], str], start: int, cap: int, predicted: bool = True, out: Outcome | None = None
) -> Outcome:
    """Find the largest batch in [1, cap] for which ``try_batch`` returns ``ok`` (it returns a run
    status), assuming every batch above an oom one runs out of memory too. ``out`` is filled as the
    tries go, so a caller interrupted midway still has them."""
    out = Outcome() if out is None else out
    lo, hi = 0, None  # the largest ok batch so far, the smallest oom batch so far
    batch, moved = max(1, min(start, cap)), False  # moved: the first step away from the prediction was taken

    def attempt(b: int) -> str | None:
        status = try_batch(b)
        out.tried.append((b, status))
        if status not in ("ok", "oom"):
            out.status, out.error = "failed", f"the try at batch={b} ended {status}: the memory limit is unknown"
            return None
        return status

    while hi is None or lo == 0:  # bracket: one ok batch and the oom batch above it
        status = attempt(batch)
        if status is None:
            return out
        if status == "ok":
            lo = batch
            if batch >= cap:
                out.capped = True
                break
            factor = FIRST_GROWTH if predicted and not moved else 2.0
            moved = True
            batch = min(cap, max(batch + 1, math.floor(batch * factor)))
            if hi is not None:
                batch = min(batch, hi - 1)
        else:
            hi = batch
            if batch == 1:
                out.status = "none_fit"
                out.first_oom_batch = 1
                return out
            factor = FIRST_GROWTH if predicted and not moved else 2.0
            moved = True
            batch = (
                max(lo + 1, math.floor(batch / factor)) if lo else max(1, min(batch - 1, math.floor(batch / factor)))
            )
        if lo and hi is not None and hi - lo <= 1:
            break
    while hi is not None and hi - lo > 1:  # bisect
        mid = (lo + hi) // 2
        status = attempt(mid)
        if status is None:
            return out
        lo, hi = (mid, hi) if status == "ok" else (lo, mid)
    out.max_batch, out.first_oom_batch, out.status = lo, hi, "done"
    return out


def with_batch(overrides: list[str], batch: int, **context: Any) -> list[str]:
    """A search try's overrides: the grid point's, with ``batch`` and the ``sweep.*`` keys given
    replaced (Hydra refuses a key given twice)."""
    keys = {"batch", *(f"sweep.{k}" for k in context)}
    kept = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in keys]
    return [*kept, f"batch={batch}", *(f"sweep.{k}={v}" for k, v in context.items())]


def predicted_max_batch(
    predict_at: Callable[[int], Any], free_bytes: int | None, fits: Callable[[Any, int], bool]
) -> int | None:
    """The largest batch whose predicted peak fits ``free_bytes``: ``predict_at(b)`` gives the
    ledger of batch b (None: no ledger for this model), ``fits(ledger, free)`` the rule. The peak
    grows with the batch, so a doubling then a bisection finds it in ~2 log2(b) predictions."""
    if free_bytes is None or (first := predict_at(1)) is None:
        return None
    if not fits(first, free_bytes):
        return 1  # even batch 1 is predicted not to fit: let a job show it
    lo, hi = 1, 2
    while fits(predict_at(hi), free_bytes):
        lo, hi = hi, hi * 2
        if hi > 2**24:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(predict_at(mid), free_bytes) else (lo, mid)
    return lo


def begin(engine: Any, sweep_id: int, grid_index: int, overrides: list[str], cfg: PerfsweepConfig) -> int:
    shown = " ".join(o for o in overrides if not o.startswith("sweep."))
    with store.session(engine) as s:
        row = store.BatchSearch(
            sweep_id=sweep_id, grid_index=grid_index, overrides=shown, seq_len=cfg.seq_len, status="running"
        )
        s.add(row)
        s.flush()
        return row.id


def record_prediction(engine: Any, search_id: int, free_bytes: int | None, predicted: int | None) -> None:
    with store.session(engine) as s:
        s.execute(
            update(store.BatchSearch)
            .where(store.BatchSearch.id == search_id)
            .values(free_bytes=free_bytes, predicted_max_batch=predicted)
        )


def finish(engine: Any, search_id: int, out: Outcome) -> None:
    """Store the outcome with the figures of the ok run at the largest batch."""
    Run = store.Run
    with store.session(engine) as s:
        best = None
        if out.max_batch is not None:
            best = s.scalars(
                select(Run)
                .where(Run.batch_search_id == search_id, Run.batch == out.max_batch, Run.status == "ok")
                .order_by(Run.id.desc())
            ).first()
        s.execute(
            update(store.BatchSearch)
            .where(store.BatchSearch.id == search_id)
            .values(
                status=out.status,
                error=out.error,
                max_batch=out.max_batch,
                first_oom_batch=out.first_oom_batch,
                capped=out.capped,
                n_tried=len(out.tried),
                best_run_id=best.id if best else None,
                tokens_per_s=best.tokens_per_s if best else None,
                samples_per_s=best.samples_per_s if best else None,
                peak_allocated_bytes=best.peak_allocated_bytes if best else None,
                finished_at=store.utcnow(),
            )
        )


def interrupted(engine: Any, search_id: int, out: Outcome) -> None:
    out.status, out.error = "interrupted", "the sweep stopped before the search finished"
    finish(engine, search_id, out)


def is_search(cfg: PerfsweepConfig) -> bool:
    return cfg.batch == MAX_BATCH


def run(
    engine: Any,
    sweep_id: int,
    grid_index: int,
    overrides: list[str],
    cfg: PerfsweepConfig,
    launch: Callable[[list[str]], str],
) -> Outcome:
    """One ``batch=max`` grid point: predict, then try batches as jobs (``launch(overrides)``
    runs one and returns its status) until the largest that fits is known; stored as it goes."""
    import torch

    from perfsweep import data as data_mod
    from perfsweep import launcher, runner

    search_id = begin(engine, sweep_id, grid_index, overrides, cfg)
    device_type, free = launcher.job_free_bytes(cfg)
    token_data = data_mod.prepare(cfg.data, cfg.seed) if cfg.data._target_ is None else None

    def predict_at(batch: int) -> Any:
        at = copy.copy(cfg)
        at.batch = batch
        return runner.predict_memory(at, token_data, torch.device(device_type or "cpu"))

    predicted = predicted_max_batch(predict_at, free, lambda ledger, free_bytes: ledger.fits(free_bytes))
    record_prediction(engine, search_id, free, predicted)
    print(
        f"perfsweep: batch=max for {' '.join(o for o in overrides if not o.startswith('sweep.')) or 'the defaults'}: "
        + (f"the ledger predicts {predicted} fits" if predicted else "no ledger for this model, starting at 1"),
        file=sys.stderr,
        flush=True,
    )
    out = Outcome()
    try:
        search(
            lambda b: launch(with_batch(overrides, b, batch_search_id=search_id)),
            predicted or 1,
            cfg.max_batch_cap,
            predicted=predicted is not None,
            out=out,
        )
    except BaseException:
        interrupted(engine, search_id, out)
        raise
    finish(engine, search_id, out)
    return out
