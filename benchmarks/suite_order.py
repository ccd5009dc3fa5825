"""How long the suite's files take, and when the suite would end if they were dealt out in
tests/conftest.py's LONGEST_FIRST order: to keep that order right as tests change.

    python benchmarks/suite_order.py JUNIT.xml [JUNIT.xml ...] [--workers 8]

Reads pytest's junit XML (``pytest --junitxml=FILE``; ``benchmarks/gpu_session.sh tests`` writes
one), maps each test to the file that holds it now (a test moved since is counted where it is),
and prints each file's seconds, then the end of a simulation: each file, in LONGEST_FIRST order
and then the rest in collection order, goes whole to the worker that is free first, as pytest-xdist's
``--dist loadfile`` deals them. The simulation keeps each test's measured seconds, though a
different mix of neighbours changes them; it is a guide to the order, not a forecast of the clock.
Several files add up (a second run of the tests the first did not finish, say).
"""

from __future__ import annotations

import argparse
import heapq
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _home_of_each_test() -> dict[str, str]:
    home = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for m in re.finditer(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M):
            home[m.group(1)] = path.stem
    return home


def file_seconds(junit_files: list[Path]) -> Counter[str]:
    home = _home_of_each_test()
    seconds: Counter[str] = Counter()
    for junit in junit_files:
        for case in ET.parse(junit).iter("testcase"):
            name = case.get("name", "").split("[")[0]
            if case.get("classname") and name in home:  # a module skipped whole has no test name
                seconds[home[name]] += float(case.get("time") or 0)
    return seconds


def simulated_end(seconds: Counter[str], order: list[str], workers: int) -> float:
    free = [(0.0, w) for w in range(workers)]
    for name in order:
        at, w = heapq.heappop(free)
        heapq.heappush(free, (at + seconds[name], w))
    return max(at for at, _ in free)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", nargs="+", type=Path)
    parser.add_argument("--workers", type=int, default=8, help="xdist workers (pyproject: at most 8)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        print(f"suite_order: --workers {args.workers}: must be 1 or more", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from tests.conftest import LONGEST_FIRST

    try:
        seconds = file_seconds(args.junit)
    except (OSError, ET.ParseError) as exc:
        print(f"suite_order: cannot read a junit XML file: {exc}", file=sys.stderr)
        return 2
    if not seconds:
        print(f"suite_order: no test of this suite in {', '.join(map(str, args.junit))}", file=sys.stderr)
        return 2
    order = [f for f in LONGEST_FIRST if f in seconds] + sorted(f for f in seconds if f not in LONGEST_FIRST)
    for name, s in seconds.most_common():
        print(f"{name:28s} {s:8.1f} s{'' if name in LONGEST_FIRST else '   (not in LONGEST_FIRST)'}")
    total = sum(seconds.values())
    print(
        f"\n{len(seconds)} files, {total:.0f} worker-seconds; over {args.workers} workers at best {total / args.workers:.0f} s"
    )
    print(f"dealt in LONGEST_FIRST order: ends at {simulated_end(seconds, order, args.workers):.0f} s")
    longest = sorted(seconds, key=lambda f: -seconds[f])
    print(f"dealt longest first by these seconds: ends at {simulated_end(seconds, longest, args.workers):.0f} s")
    print(
        f"dealt in name order (for comparison): ends at {simulated_end(seconds, sorted(seconds), args.workers):.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
