"""``batch=max``: the largest batch a grid point trains at without running out of memory.

The memory ledger (perfsweep.ledger) predicts the largest fitting batch from the device's free
memory, as a job process sees it; real jobs then decide. From the prediction the search grows
(x1.25 once: the ledger is within a few percent on the runs we measured; then x2) until a job
runs out of memory, or shrinks (/1.25 once, then /2) until one trains, and then bisects between
the largest ok and the smallest oom batch until they are neighbours. An ok try's measured use of
the memory (CUDA's peak reserved bytes; a CPU job's address space under ``job_memory_limit_mib``)
calibrates the ledger, which counts tensors alone, and the batch that calibration puts at the
edge is tried next (:class:`Calibration`). Every try is an ordinary job of the sweep, stored in
``runs`` with its status (oom rows included) and ``batch_search_id``; the outcome is a row of
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

from perfsweep import interrupts, store
from perfsweep.cli import first_line
from perfsweep.config import MAX_BATCH, PerfsweepConfig
from perfsweep.names import NOT_OVERRIDES

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
    calibrated_max_batch: int | None = None
    """The largest fitting batch by the first ok try's measured peak (``estimate``), tried next."""

    @property
    def exit_status(self) -> str:
        """The run status the search counts as for the sweep's exit code: its oom tries are the
        point of it, so a search that found its batch is ok."""
        return {"done": "ok", "none_fit": "oom"}.get(self.status, "failed")


CALIBRATED_WALK = 3
"""How many batches the search tries beyond a calibrated estimate that missed, in steps of 1, 2
and 4 (1, 3 and 7 away from it), before it bisects: the estimate was 0 to 6 batches off in
docs/benchmarks.md's runs of 2026-11-26 (morning), and 0 to 7 after the profiler moved ahead of
the job memory limit (7 away is the walk's last try)."""


class _TryEnded(Exception):
    """A try ended neither ok nor oom: the search stops (Outcome.status is set)."""


def search(
    try_batch: Callable[[int], str],
    start: int,
    cap: int,
    predicted: bool = True,
    out: Outcome | None = None,
    estimate: Callable[[int], int | None] | None = None,
) -> Outcome:
    """Find the largest batch in [1, cap] for which ``try_batch`` returns ``ok`` (it returns a run
    status), assuming every batch above an oom one runs out of memory too. ``out`` is filled as the
    tries go, so a caller interrupted midway still has them.

    ``estimate(b)`` is asked after each ok try until its answer is taken: the largest batch that
    fits by what the try at b measured (None: not known yet). An answer below a batch that trained
    or at one that ran out of memory is wrong, and one past twice the largest ok batch while none
    has run out is beyond the growth the search makes anyway (a line through two tiny batches);
    neither is taken, and the estimate is asked again after the next try.
    A taken answer is stored in ``out.calibrated_max_batch`` and tried next, then up to
    :data:`CALIBRATED_WALK` batches on the side it missed; what is left is grown into or bisected
    as without it. An estimate a few batches off (the run-to-run noise of a measured peak) ends
    the search in two to six tries; a wrong one costs a few more than without it (the walk, and
    the wider bracket it may leave: at most six more over 3.9 million simulated searches)."""
    out = Outcome() if out is None else out
    lo, hi = 0, None  # the largest ok batch so far, the smallest oom batch so far
    first_move = predicted  # the first step away from the prediction is x1.25 (or /1.25), later ones x2

    def attempt(b: int) -> bool:
        nonlocal lo, hi
        try:
            status = try_batch(b)
        except BaseException as exc:  # the try counts in n_tried, as its runs row does
            out.tried.append((b, "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"))
            raise
        out.tried.append((b, status))
        if status not in ("ok", "oom"):
            out.status, out.error = "failed", f"the try at batch={b} ended {status}: the memory limit is unknown"
            raise _TryEnded
        if status == "ok":
            lo = max(lo, b)
        else:
            hi = b if hi is None else min(hi, b)
        return status == "ok"

    def factor() -> float:
        nonlocal first_move
        f, first_move = (FIRST_GROWTH if first_move else 2.0), False
        return f

    def top() -> int:
        """The largest batch still worth trying."""
        return min(cap, hi - 1) if hi is not None else cap

    def calibrate() -> None:
        """After an ok try: the estimate, if it answers and is taken (once), and a short walk from it."""
        if estimate is None or out.calibrated_max_batch is not None or (guess := estimate(lo)) is None:
            return
        if guess < lo or (guess >= hi if hi is not None else guess > 2 * lo):
            return  # outside what the tries have shown, or no nearer than growth would go: not taken
        out.calibrated_max_batch = guess
        if lo >= top():
            return  # nothing is left to try
        b = max(lo + 1, min(guess, top()))
        walk = iter(2**i for i in range(CALIBRATED_WALK))
        if attempt(b):
            while lo < top() and (step := next(walk, None)) is not None and attempt(min(lo + step, top())):
                pass
        else:
            while hi - lo > 1 and (step := next(walk, None)) is not None and not attempt(max(hi - step, lo + 1)):
                pass

    try:
        batch = max(1, min(start, cap))
        while not attempt(batch):  # down from the start until a batch trains
            if batch == 1:
                out.status, out.first_oom_batch = "none_fit", 1
                return out
            batch = max(1, min(batch - 1, math.floor(batch / factor())))
        calibrate()
        while hi is None and lo < cap:  # up until a batch runs out of memory
            attempt(min(cap, max(lo + 1, math.floor(lo * factor()))))
            calibrate()
        while hi is not None and hi - lo > 1:  # bisect
            attempt((lo + hi) // 2)
            calibrate()
    except _TryEnded:
        return out
    out.max_batch, out.first_oom_batch, out.status, out.capped = lo, hi, "done", hi is None and lo >= cap
    return out


@dataclass
class Calibration:
    """batch=max's estimate of the largest fitting batch from what ok tries measured.

    The ledger predicts the bytes of live tensors; what runs into the limit is more: the CUDA
    caching allocator's reserved segments, or on a CPU under ``job_memory_limit_mib`` the whole
    address space (thread stacks, malloc's unreturned memory, libraries loaded after start-up: 61
    to 74 MiB of a 300 MiB limit for the tiny GPT, which put the ledger's first try at 321 where
    264 to 272 fit; 134 to 144 MiB before the profiler was mapped ahead of the limit). Both grow with
    the batch as the ledger does, so one measured try fixes the offset: the estimate is the largest
    batch b with used(tried) + ledger(b) - ledger(tried) within ``free_bytes``. Without a ledger
    the line through the two largest measured tries stands in for it."""

    free_bytes: int
    ledger_bytes: Callable[[int], int] | None
    """The ledger's bytes at a batch, as the measured use counts them (``Ledger.reserved_bytes``:
    the peak, plus the CUDA allocator's slack, which grows with it); None: no ledger."""
    used: dict[int, int] = field(default_factory=dict)
    """batch -> bytes used, as measured by the ok tries so far."""
    basis: str = ""
    """What the latest estimate rests on, for people: 'batch 128 used 250.9 of the 300.0 MiB free'."""

    def estimate(self, batch: int, used: int | None) -> int | None:
        """The estimate after an ok try at ``batch`` that used ``used`` bytes (None: not measured
        on this device); None while there is too little to go on."""
        if used is None:
            return None
        self.used[batch] = used
        free = f"of the {self.free_bytes / 2**20:,.1f} MiB free"
        if (peak := self.ledger_bytes) is not None:
            offset = used - peak(batch)
            self.basis = f"batch {batch} used {used / 2**20:,.1f} {free}; the ledger shifted by that"
            if peak(1) + offset > self.free_bytes:
                return 0  # not even batch 1, by this measurement: contradicted by the try, never taken
            return predicted_max_batch(peak, self.free_bytes, lambda p, free: p + offset <= free)
        if len(self.used) < 2:
            return None
        (b1, u1), (b2, u2) = sorted(self.used.items())[-2:]
        if u2 <= u1:  # no growth seen yet: nothing to extrapolate
            return None
        self.basis = (
            f"batches {b1} and {b2} used {u1 / 2**20:,.1f} and {u2 / 2**20:,.1f} {free}; on the line through them"
        )
        return b2 + math.floor((self.free_bytes - u2) * (b2 - b1) / (u2 - u1))


def measured_use(engine: Any, search_id: int, batch: int) -> int | None:
    """What the search's ok try at ``batch`` used of the memory free to a job: on CUDA its peak
    reserved bytes, on a CPU its ``memory_limit_used_bytes`` (null without a limit: MemAvailable
    moves with everything else on the machine, so there is nothing to calibrate against)."""
    Run = store.Run
    with store.session(engine) as s:
        row = s.execute(
            select(Run.device_type, Run.peak_reserved_bytes, Run.memory_limit_used_bytes)
            .where(Run.batch_search_id == search_id, Run.batch == batch, Run.status == "ok")
            .order_by(Run.id.desc())
        ).first()
    if row is None:
        return None
    return row.peak_reserved_bytes if row.device_type == "cuda" else row.memory_limit_used_bytes


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


def point_label(overrides: list[str]) -> str:
    """The grid point's own overrides, without how the sweep runs (names.NOT_OVERRIDES): a resumed
    search's row read 'resume=True', and every repeat's the same 'repeat=2'."""
    return " ".join(o for o in overrides if not o.startswith(NOT_OVERRIDES))


def begin(engine: Any, sweep_id: int, grid_index: int, overrides: list[str], cfg: PerfsweepConfig) -> int:
    shown = point_label([store.hide_password_in_word(o) for o in overrides])
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
    with store.session(engine) as s:
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
                calibrated_max_batch=out.calibrated_max_batch,
                finished_at=store.utcnow(),
                **store.search_best_figures(s, search_id, out.max_batch),
            )
        )


def interrupted(engine: Any, search_id: int, out: Outcome) -> None:
    out.status, out.error = "interrupted", "the sweep stopped before the search finished"
    finish(engine, search_id, out)


def ended_by(engine: Any, search_id: int, out: Outcome, exc: BaseException) -> None:
    """Store a search that an exception ended: a Ctrl-C or SIGTERM as interrupted, anything else as
    failed with its first line (the search row said running for good)."""
    if isinstance(exc, KeyboardInterrupt):
        interrupted(engine, search_id, out)
        return
    out.status, out.error = "failed", f"the search stopped: {first_line(exc)}"
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
    runs one and returns its status) until the largest that fits is known; stored as it goes,
    and stored as ended however it ends (a Ctrl-C while the prediction is made included)."""
    search_id = begin(engine, sweep_id, grid_index, overrides, cfg)
    out = Outcome()
    try:
        _predict_and_search(engine, search_id, overrides, cfg, launch, out)
    except BaseException as exc:
        with interrupts.held():  # a second Ctrl-C while the end is written left the row 'running' for good
            try:
                ended_by(engine, search_id, out, exc)
            except Exception as store_exc:  # noqa: BLE001 - the search's own end is what the user is told
                log.warning("could not store how batch search %d ended: %s", search_id, first_line(store_exc))
        raise
    with interrupts.held():
        finish(engine, search_id, out)
    return out


def _predict_and_search(
    engine: Any,
    search_id: int,
    overrides: list[str],
    cfg: PerfsweepConfig,
    launch: Callable[[list[str]], str],
    out: Outcome,
) -> None:
    import torch

    from perfsweep import corpus, launcher, runner

    device_type, free = launcher.job_free_bytes(cfg)
    token_data = corpus.prepare(cfg.data, cfg.seed) if cfg.data._target_ is None else None

    def predict_at(batch: int) -> Any:
        at = copy.copy(cfg)
        at.batch = batch
        return runner.predict_memory(at, token_data, torch.device(device_type or "cpu"))

    predicted = predicted_max_batch(predict_at, free, lambda ledger, free_bytes: ledger.fits(free_bytes))
    record_prediction(engine, search_id, free, predicted)
    if predicted is not None:
        start = f"the ledger predicts {predicted} fits"
    elif free is None:
        start = "the memory free to a job could not be read, starting at 1"
    else:
        start = "no ledger for this model, starting at 1"
    print(f"perfsweep: batch=max for {point_label(overrides) or 'the defaults'}: {start}", file=sys.stderr, flush=True)
    calibration = None
    if free is not None:
        calibration = Calibration(free, (lambda b: predict_at(b).reserved_bytes) if predicted is not None else None)

    def estimate(batch: int) -> int | None:
        return None if calibration is None else calibration.estimate(batch, measured_use(engine, search_id, batch))

    told: list[int] = []

    def try_batch(batch: int) -> str:
        if out.calibrated_max_batch is not None and not told and calibration is not None:  # just taken
            told.append(out.calibrated_max_batch)
            print(
                f"perfsweep: batch=max: {calibration.basis}, {out.calibrated_max_batch} fits",
                file=sys.stderr,
                flush=True,
            )
        return launch(with_batch(overrides, batch, batch_search_id=search_id))

    search(try_batch, predicted or 1, cfg.max_batch_cap, predicted=predicted is not None, out=out, estimate=estimate)
