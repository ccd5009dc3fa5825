"""``python -m perfsweep.report`` (and ``perfsweep report``): charts and tables from results.db.

Examples::

    python -m perfsweep.report                          # latest sweep in ./results.db
    python -m perfsweep.report --sweep 3 --baseline amp=false,ckpt=false
    python -m perfsweep.report --sweep batch_seq --where "seq_len <= 512" --out slides/
    python -m perfsweep.report --sweep 7 --vs 5         # sweep 7 against reference sweep 5

Every user error (missing file, unknown sweep, bad SQL) is one line on stderr naming the
option and value, and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sqlalchemy.engine import Engine

from perfsweep import store
from perfsweep.cli import UserError
from perfsweep.report.build import TOP_BARS, build_report
from perfsweep.report.compare import build_compare
from perfsweep.report.frames import parse_config_spec
from perfsweep.report.load import resolve_sweep


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="perfsweep report",
        description="Charts (PNG), report.md and runs.csv for a sweep in the results database; "
        "with --vs, a config-by-config comparison of two sweeps.",
    )
    p.add_argument(
        "--db", default=store.DEFAULT_DB_ARG, help="SQLAlchemy URL or SQLite file path (default: %(default)s)"
    )
    p.add_argument(
        "--sweep",
        action="append",
        metavar="ID|NAME",
        help="sweep id, or sweeps.name (latest with that name); repeat to report several sweeps together; "
        "default: the latest sweep",
    )
    p.add_argument("--where", metavar="SQL", help="filter over runs columns, e.g. \"batch >= 8 AND status = 'ok'\"")
    p.add_argument(
        "--baseline",
        metavar="AXIS=VALUE,...",
        help="reference config for speedups, e.g. amp=false,ckpt=false; default: amp, ckpt and compile off, "
        "else the first ok run",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="output folder; default: report/ in the sweep's folder, or ./report_<id> when that folder is gone",
    )
    p.add_argument("--vs", metavar="ID|NAME", help="compare --sweep (A) with this reference sweep (B): compare.png/.md")
    p.add_argument(
        "--top", type=int, default=TOP_BARS, metavar="N", help="most configs per bar chart (default: %(default)s)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log what is drawn and how long it takes")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the report command; returns the exit status (0 ok, 2 for a user error)."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.top < 1:
            raise UserError(f"--top {args.top}: must be at least 1")
        try:
            baseline = parse_config_spec(args.baseline) if args.baseline else None
        except ValueError as exc:
            raise UserError(f"--baseline {args.baseline}: {exc}") from None
        engine = store.open_existing(args.db)
        try:
            print(_run(engine, args, baseline))
        finally:
            engine.dispose()
    except UserError as exc:
        print(f"perfsweep report: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(engine: Engine, args: argparse.Namespace, baseline: dict | None) -> str:
    if args.vs is None:
        ids = list(dict.fromkeys(resolve_sweep(engine, s, "--sweep") for s in args.sweep or [None]))
        out = build_report(engine, ids, out_dir=args.out, baseline=baseline, where=args.where, top=args.top)
        return f"Report: {out / 'report.md'}"
    if args.sweep and len(args.sweep) > 1:
        raise UserError(f"--vs {args.vs}: give exactly one --sweep to compare (got {len(args.sweep)})")
    a, b = (
        resolve_sweep(engine, args.sweep[0] if args.sweep else None, "--sweep"),
        resolve_sweep(engine, args.vs, "--vs"),
    )
    if a == b:
        raise UserError(f"--vs {args.vs}: is the same sweep as --sweep ({a})")
    return f"Compare: {build_compare(engine, a, b, out_dir=args.out, where=args.where) / 'compare.md'}"


if __name__ == "__main__":
    sys.exit(main())
