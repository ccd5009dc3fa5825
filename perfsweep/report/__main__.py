"""``python -m perfsweep.report`` (and ``perfsweep report``): charts and tables from results.db
(examples in README.md, "Reports").

Every user error (missing file, unknown sweep, bad SQL) is one line on stderr naming the
option and value, and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from perfsweep import store
from perfsweep.cli import OneLineParser, UserError, first_line
from perfsweep.configs import parse_config_spec
from perfsweep.report.build import SCRATCH_PREFIX, TOP_BARS, build_report
from perfsweep.report.compare import build_compare
from perfsweep.results import load_sweeps, resolve_sweep


def _folder(text: str) -> Path:
    """``--out``: an empty one was ``Path("")``, the current folder, where the report's files then went."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a folder (it is created if missing)")
    return Path(text)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="perfsweep report",
        description="Charts (PNG), report.md and runs.csv for a sweep in the results database; with --vs, a "
        "config-by-config comparison of two sweeps. Speedups are over --baseline; by default the config with amp, ckpt "
        "and compile off, else the first ok one.",
    )
    add = p.add_argument
    add("--db", default=store.DEFAULT_DB_ARG, help="SQLAlchemy URL or SQLite file path (default: %(default)s)")
    add("--sweep", action="append", metavar="ID|NAME", help="sweep id or name; repeat for several (default: latest)")
    add("--where", metavar="FILTER", help="filter over runs columns, e.g. \"batch >= 8 AND status = 'ok'\"")
    add("--baseline", metavar="AXIS=VALUE,...", help="reference config for speedups, e.g. amp=false,ckpt=false")
    add(
        "--out",
        type=_folder,
        metavar="DIR",
        help=(
            "output folder (default: report/ in the sweep's folder, or ./report_<ids>/ for several sweeps or "
            "when that folder is gone; with --vs B: compare_vs_B/ there, or ./compare_<A>_vs_<B>/; with --where or "
            "--baseline, the same name plus _<hash of them>, so the full report stays)"
        ),
    )
    add("--vs", metavar="ID|NAME", help="compare --sweep (A) with this reference sweep (B): compare.png/.md")
    add("--top", type=int, default=TOP_BARS, metavar="N", help="most configs per bar chart (default: %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the report command; returns the exit status (0 ok, 2 for a user error)."""
    args = parser().parse_args(argv)
    try:
        if args.top < 1:
            raise UserError(f"--top {args.top}: must be at least 1")
        for option, value in (("--where", args.where), ("--baseline", args.baseline)):
            if value is not None and not value.strip():
                raise UserError(f"{option} is empty: give a filter or leave the option out")
        if args.out is not None and args.out.exists() and not args.out.is_dir():
            raise UserError(f"--out {args.out}: is a file; give a folder (it is created if missing)")
        try:
            baseline = parse_config_spec(args.baseline) if args.baseline else None
        except ValueError as exc:
            raise UserError(f"--baseline {args.baseline}: {exc}") from None
        engine = store.open_existing(args.db)
        try:
            print(_run(engine, args, baseline))
        except (SQLAlchemyError, pd.errors.DatabaseError) as exc:  # pandas' is an OSError: not the folder's
            raise UserError(f"--db {store.hide_password(args.db)}: cannot read it ({first_line(exc, 300)})") from None
        except OSError as exc:  # a folder that cannot be made or written (a file on its path, no permission)
            path = Path(str(exc.filename or ""))
            if path.name.startswith(SCRATCH_PREFIX):  # the folder it writes in first: the report's own
                path = path.parent
            if args.out is not None:
                raise UserError(f"--out {args.out}: cannot write {path} ({exc.strerror or exc})") from None
            raise UserError(
                f"cannot write the report folder {path} ({exc.strerror or exc}); give another with --out DIR"
            ) from None
        finally:
            engine.dispose()
    except UserError as exc:
        print(f"perfsweep report: {exc}", file=sys.stderr)
        return 2
    return 0


def _run(engine: Engine, args: argparse.Namespace, baseline: dict | None) -> str:
    sweeps = [resolve_sweep(engine, s, "--sweep") for s in args.sweep or [None]]
    if not args.sweep and sweeps[0] != (newest := int(load_sweeps(engine)["id"].max())):
        print(
            f"perfsweep report: sweep {sweeps[0]}, the latest with runs (sweep {newest} has none); "
            "--sweep ID picks another",
            file=sys.stderr,
        )
    if args.vs is None:
        options = {"baseline": baseline, "where": args.where, "top": args.top}
        return f"Report: {build_report(engine, list(dict.fromkeys(sweeps)), args.out, **options) / 'report.md'}"
    if len(sweeps) > 1:
        raise UserError(f"--vs {args.vs}: give exactly one --sweep to compare (got {len(sweeps)})")
    if baseline is not None or args.top != TOP_BARS:  # a comparison pairs each config with its twin in the other sweep
        given = "--baseline" if baseline is not None else "--top"
        raise UserError(f"{given} does not apply with --vs (each config is compared with its own twin); drop it")
    if sweeps[0] == (b := resolve_sweep(engine, args.vs, "--vs")):
        given = "--sweep" if args.sweep else "the latest sweep with runs, compared when --sweep is not given"
        raise UserError(f"--vs {args.vs}: is the same sweep as {given} ({b}); give --sweep ID")
    return f"Compare: {build_compare(engine, sweeps[0], b, out_dir=args.out, where=args.where) / 'compare.md'}"


if __name__ == "__main__":
    sys.exit(main())
