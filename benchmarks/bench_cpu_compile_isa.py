"""A cold CPU compile with Inductor's vector-ISA check inside it, and with the check run first.

Each try is a fresh process that compiles the tiny GPT (forward and backward) into an empty
Inductor cache, as a ``compile_cache=isolated`` job does:

- ``inside``: the check runs inside the compile, in that empty cache (perfsweep before
  2026-11-25: every isolated job repeated it, and ``compile_time_ms`` held it);
- ``first``: ``perfsweep.compile.cache_scope(..., probe_cpu=True)`` runs it in the user's cache
  (warm after the first try, as on any machine that has compiled once) before the compile.

The two ways alternate, so the VM's drift falls on both alike:

    python benchmarks/bench_cpu_compile_isa.py --rounds 3

prints per try the compile's time (the first step, as ``compile_time_ms`` counts it) and the
process's wall time, then the medians and their ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _bench  # benchmarks/_bench.py, beside this script

SCRIPT = """
import json, os, sys, time
from pathlib import Path
import torch
from perfsweep import compile as compile_mod
from perfsweep.model import build

way, user, job = sys.argv[1], sys.argv[2], Path(sys.argv[3])
os.environ["TORCHINDUCTOR_CACHE_DIR"] = user
with compile_mod.cache_scope("isolated", job, probe_cpu=way == "first"):
    model = build(vocab_size=2048, n_layers=2, n_heads=2, d_model=32, d_ff=128, max_seq_len=64, dropout=0.0, bias=True)
    compiled = compile_mod.apply(model, "inductor", None)
    x = torch.randint(0, 2048, (4, 32))
    t0 = time.perf_counter()
    compiled(x, x).loss.backward()
    print(json.dumps({"compile_s": time.perf_counter() - t0}))
"""


def one(way: str, user: Path, scratch: Path) -> dict[str, float]:
    job = Path(tempfile.mkdtemp(dir=scratch))
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, way, str(user), str(job)], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - t0
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=_bench.at_least(1), default=3)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"inside": [], "first": []}
    with tempfile.TemporaryDirectory() as tmp:
        scratch, user = Path(tmp), Path(tmp) / "user-cache"
        one("first", user, scratch)  # the user's cache holds the check from here on, as on a used machine
        for r in range(args.rounds):
            for way in ("inside", "first") if r % 2 == 0 else ("first", "inside"):
                res = one(way, user, scratch)
                results[way].append(res)
                print(f"round {r + 1} {way:>6}: compile {res['compile_s']:.2f} s, process {res['wall_s']:.2f} s")
    med = {w: {k: statistics.median(r[k] for r in rs) for k in ("compile_s", "wall_s")} for w, rs in results.items()}
    for key in ("compile_s", "wall_s"):
        a, b = med["inside"][key], med["first"][key]
        print(f"median {key}: check inside {a:.2f} s, check first {b:.2f} s, ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
