"""The `perfsweep` command's own exit: with the interpreter's teardown, and without it.

`python -m perfsweep` ends through perfsweep.__main__.cli (exit handlers, flushes, then
os._exit); calling perfsweep.__main__.main in `python -c` ends the normal way, tearing down
torch, pandas and matplotlib. Both run the same commands, interleaved, so the VM's drift falls on
both alike:

    python benchmarks/bench_command_exit.py --rounds 3

prints the wall time of each command per round, and the median of each with their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script

TINY = _bench.TINY

WAYS = {
    "teardown": [
        sys.executable,
        "-c",
        "import sys; from perfsweep.__main__ import main; sys.argv[0] = 'perfsweep'; main()",
    ],
    "os._exit": [sys.executable, "-m", "perfsweep"],
}


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=_bench.at_least(1), default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        commands = {
            "2-job sweep": ["-m", *TINY, "amp=true,false"],
            "query": ["query", "SELECT count(*) AS n FROM runs", "--db", "results.db"],
        }
        subprocess.run([*WAYS["os._exit"], *commands["2-job sweep"]], cwd=cwd, check=True, capture_output=True)
        times: dict[tuple[str, str], list[float]] = {(c, w): [] for c in commands for w in WAYS}
        for r in range(args.rounds):
            for command, extra in commands.items():
                for way, argv in WAYS.items() if r % 2 == 0 else reversed(WAYS.items()):
                    times[(command, way)].append(t := timed([*argv, *extra], cwd))
                    print(f"round {r + 1}  {command:<12} {way:<9} {t:6.2f} s", flush=True)
        print()
        for command in commands:
            before, after = (statistics.median(times[(command, w)]) for w in WAYS)
            print(f"{command:<12} teardown {before:6.2f} s  os._exit {after:6.2f} s  ratio {after / before:.2f}")


if __name__ == "__main__":
    main()
