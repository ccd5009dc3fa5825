"""The H100 minigpt_seed sweep as perfsweep stores it now: the fixture database's measured rows
with stages, kernel categories, busy time and verdict re-derived from the fixture traces.

Only the analysis is re-run; every timing and memory figure is the one measured on the H100
(see tests/fixtures/h100/README.md).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from perfsweep import store
from perfsweep.metrics import bottleneck_verdict
from perfsweep.profiling import kernel_rows, stage_rows
from perfsweep.trace import analyze

H100 = Path(__file__).parent / "fixtures" / "h100"
SEED_SWEEP = 1
"""Sweep 1 of the fixture database: minigpt_seed, fp16, amp x ckpt."""


def _trace_name(row: dict) -> str:
    return f"minigpt_seed_fp16_amp{int(row['amp'])}_ckpt{int(row['ckpt'])}.trace.json.gz"


def build_h100_db(db: Path) -> str:
    """Write the re-analysed H100 seed sweep into a new SQLite file ``db``; returns its URL."""
    src = sqlite3.connect(f"file:{H100 / 'results-fp16-seed-snapshot-gpt2.db'}?immutable=1", uri=True)
    src.row_factory = sqlite3.Row
    sweep = dict(src.execute("SELECT * FROM sweeps WHERE id = ?", (SEED_SWEEP,)).fetchone())
    rows = [dict(r) for r in src.execute("SELECT * FROM runs WHERE sweep_id = ? ORDER BY job_num", (SEED_SWEEP,))]
    src.close()
    url = f"sqlite:///{db}"
    engine = store.connect(url)
    try:
        sid = store.get_or_create_sweep(
            engine,
            sweep["sweep_dir"],
            sweep["name"],
            command=sweep["command"],
            n_jobs=sweep["n_jobs"],
            hostname=sweep["hostname"],
        )
        columns = set(store.Run.__table__.columns.keys()) - {"id"}
        for row in rows:
            result = {k: v for k, v in row.items() if k in columns}
            for key in ("amp", "ckpt", "compile", "optimizer_fused"):
                result[key] = bool(result[key]) if result[key] is not None else None
            result["sweep_id"] = sid
            a = analyze(H100 / _trace_name(row))
            result.update(
                bottleneck_verdict(a.gpu_busy_ms, row["step_time_ms_median"], row["data_wait_fraction"]).row()
            )
            result["stages"] = stage_rows(a, on_cuda=True)
            result["kernels"] = kernel_rows(a)
            for key in ("started_at", "finished_at"):
                if isinstance(result.get(key), str):
                    result[key] = result[key].replace(" ", "T")
            result["config_json"] = {}
            result["graph_break_reasons"] = None
            store.save_run(engine, result)
    finally:
        engine.dispose()
    return url
