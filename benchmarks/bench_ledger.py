"""How close the memory ledger (perfsweep/ledger.py) comes to the measured peak.

Runs real sweeps on this machine's CPU and reads ``predicted_peak_bytes`` next to the measured
``peak_allocated_bytes`` from their results.db; then predicts each run of the H100 sweep of
2026-11-26 (tests/fixtures/h100-2026-11-26, the project's own copy) from its stored config and
compares with the peak the H100 measured. Target: within 15% for perfsweep's GPT. Usage:

    python benchmarks/bench_ledger.py            # CPU sweeps (a few minutes on 2 cores) + the H100 runs
    python benchmarks/bench_ledger.py --h100-only

Not the shared runs of 2026-11-22 (../shared/gpu/h100-2026-11-22): their training step held the
logits through backward (``_, loss = self.model(x, y)``), which today's does not, so today's
ledger is 16-17% under their compiled peaks (docs/benchmarks.md, "The memory ledger against these
peaks").
"""

from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script

from perfsweep import ledger

SWEEPS = {
    "default sweep": ["amp=true,false", "ckpt=true,false"],
    "dropout 0.1 (CPU math attention)": ["model.dropout=0.1", "amp=true,false", "ckpt=true,false"],
    "batch x seq_len": ["batch=4,16", "seq_len=64,256"],
}
H100 = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h100-2026-11-26" / "results-seed-gpt2.db"
MIB = 2**20


def cpu_rows() -> list[tuple[str, str, float, float, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in SWEEPS.items():
            cmd = [sys.executable, "-m", "perfsweep", "-m", *overrides, "device=cpu", "report=false"]
            _bench.run_sweep(cmd, tmp)
            db = sqlite3.connect(Path(tmp) / "results.db")
            sweep_id = db.execute("SELECT max(id) FROM sweeps").fetchone()[0]
            for overrides_text, pred, meas, err in db.execute(
                "SELECT overrides, predicted_peak_bytes, peak_allocated_bytes, predicted_peak_error FROM runs "
                "WHERE sweep_id = ? AND status = 'ok' ORDER BY job_num",
                (sweep_id,),
            ):
                rows.append((name, overrides_text, pred / MIB, meas / MIB, err))
    return rows


def h100_rows() -> list[tuple[str, str, float, float | None, float | None]]:
    rows = []
    for db_path in [H100]:
        db = sqlite3.connect(f"file:{db_path}?immutable=1", uri=True)
        for cfg_json, status, peak, vocab in db.execute(
            "SELECT config_json, status, peak_allocated_bytes, coalesce(vocab_size_padded, vocab_size) FROM runs "
            "WHERE vocab_size IS NOT NULL ORDER BY id"
        ):
            cfg, m = json.loads(cfg_json), json.loads(cfg_json)["model"]
            shape = ledger.GPTShape(  # the vocabulary as the run padded it
                m["n_layers"], m["n_heads"], m["d_model"], m["d_ff"], m["max_seq_len"], vocab, m["bias"], m["dropout"]
            )
            setting = ledger.Setting(cfg["batch"], cfg["seq_len"], cfg["amp"], cfg["ckpt"], cfg["compile"], "cuda")
            pred = ledger.predict_gpt(shape, setting).peak_bytes
            label = (
                f"{m['name']} {cfg['amp_dtype'] if cfg['amp'] else 'fp32'} ckpt={cfg['ckpt']} "
                f"compile={cfg['compile']} {cfg['batch']}x{cfg['seq_len']} vocab {vocab} ({status})"
            )
            rows.append(
                (db_path.name, label, pred / MIB, peak / MIB if peak else None, pred / peak - 1 if peak else None)
            )
    return rows


def table(rows: list[tuple]) -> str:
    lines = ["| sweep | config | predicted MiB | measured MiB | error |", "|---|---|---:|---:|---:|"]
    for name, label, pred, meas, err in rows:
        m = f"{meas:,.1f}" if meas is not None else "-"
        e = f"{err:+.1%}" if err is not None else "-"
        lines.append(f"| {name} | {label} | {pred:,.1f} | {m} | {e} |")
    errors = [abs(r[4]) for r in rows if r[4] is not None]
    if errors:
        lines.append(
            f"\nlargest |error| {max(errors):.1%}, mean {sum(errors) / len(errors):.1%} over {len(errors)} runs"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--h100-only", action="store_true")
    args = parser.parse_args()
    print(
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, {platform.processor() or platform.machine()}"
    )
    if not args.h100_only:
        print("\nCPU sweeps on this machine:\n")
        print(table(cpu_rows()))
    print(f"\nH100 runs ({H100}):\n")
    print(table(h100_rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
