"""batch=max: the search's logic against an oracle, then a real sweep whose jobs run out of a
capped address space, into the database, the summary and the report."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfsweep.search import CALIBRATED_WALK, Calibration, Outcome, predicted_max_batch, search, with_batch
from tests.util import run_perfsweep
from tests.util import sqlite_rows as rows


def oracle(limit: int, log: list[int]):
    def try_batch(b: int) -> str:
        assert b not in log, f"batch {b} tried twice"
        log.append(b)
        return "ok" if b <= limit else "oom"

    return try_batch


@pytest.mark.parametrize("start", [1, 30, 37, 38, 40, 200, 4096])
@pytest.mark.parametrize("limit", [1, 37, 1000])
def test_search_finds_the_largest_ok_batch_from_any_start(start: int, limit: int) -> None:
    log: list[int] = []
    out = search(oracle(limit, log), start, cap=4096, predicted=start > 1)
    assert (out.status, out.max_batch, out.first_oom_batch, out.capped) == ("done", limit, limit + 1, False)
    assert [b for b, _ in out.tried] == log and len(log) <= 2 * 12 + 2  # logarithmic in the range
    assert all((s == "ok") == (b <= limit) for b, s in out.tried)


def test_a_good_prediction_needs_few_jobs() -> None:
    log: list[int] = []
    assert search(oracle(245, log), 240, cap=4096).max_batch == 245
    assert len(log) <= 8, log  # 240 ok, 300 oom, then a bisection over 60


@pytest.mark.parametrize("error", [-60, -9, -3, -1, 0, 1, 2, 5, 40, 3000])
@pytest.mark.parametrize("start", [5, 160, 321])
def test_an_estimate_from_a_measured_try_is_tried_next_and_a_wrong_one_costs_little(start: int, error: int) -> None:
    """The estimate is taken where the tries so far allow it (not below an ok batch, not at or
    above an oom one, not past twice the largest ok batch while none ran out) and tried next; on a
    miss the search walks 1, 3 and 7 batches away, then bisects: a good estimate ends it in a few
    tries, a wrong one costs at most five more than no estimate."""
    limit, log, plain = 177, [], []
    search(oracle(limit, plain), start, cap=4096)
    out = search(oracle(limit, log), start, cap=4096, estimate=lambda b: limit + error)
    assert (out.status, out.max_batch, out.first_oom_batch) == ("done", limit, limit + 1)
    assert all((s == "ok") == (b <= limit) for b, s in out.tried)
    assert len(log) <= len(plain) + CALIBRATED_WALK + 2, (log, plain)
    guess = limit + error
    for i in range(len(out.tried)):  # the first try after which the estimate could be taken
        oks = [t for t, s in out.tried[: i + 1] if s == "ok"]
        ooms = [t for t, s in out.tried[: i + 1] if s == "oom"]
        if oks and max(oks) <= guess and (guess < min(ooms) if ooms else guess <= 2 * max(oks)):
            assert out.calibrated_max_batch == guess
            top = min(ooms) - 1 if ooms else 4096
            assert log[i + 1] == max(max(oks) + 1, min(guess, top)), (log, i)  # tried next, inside the bracket
            if abs(error) <= 7:  # within the walk's reach: no try far from it
                assert all(abs(t - guess) <= 8 for t in log[i + 1 :]), log
            break
    else:
        assert out.calibrated_max_batch is None and log == plain  # never taken: the search as without it


def test_an_estimate_is_asked_again_until_the_tries_allow_it_and_a_wild_one_changes_nothing() -> None:
    """Without a ledger the estimate needs two measured tries; one past twice the largest ok
    batch waits while the batch doubles towards it. A line through two tiny batches can put the
    edge far past the truth, even past the cap: never taken, the search is the one without it."""
    log: list[int] = []
    out = search(oracle(700, log), 1, cap=4096, predicted=False, estimate=lambda b: None if b < 2 else 1000)
    assert (out.max_batch, out.calibrated_max_batch) == (700, 1000)
    assert log[:12] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 999], log  # taken once 2 x 512 >= 1000
    plain: list[int] = []
    search(oracle(700, plain), 1, cap=4096, predicted=False)
    wild: list[int] = []
    out = search(oracle(700, wild), 1, cap=4096, predicted=False, estimate=lambda b: None if b < 2 else 10**6)
    assert (out.max_batch, out.calibrated_max_batch, wild) == (700, None, plain)
    out = search(oracle(10**9, []), 100, cap=500, estimate=lambda b: 10**6)
    assert (out.max_batch, out.capped, [b for b, _ in out.tried]) == (500, True, [100, 125, 250, 500])


def test_calibration_adds_what_the_ledger_does_not_count() -> None:
    """One measured try fixes the ledger's offset; without a ledger two tries give the line."""
    peak = lambda b: 100 + 10 * b  # noqa: E731 - the ledger: 100 bytes fixed, 10 a sample
    cal = Calibration(free_bytes=1_000, ledger_bytes=peak)
    assert cal.estimate(20, used=None) is None  # not measured on this device: nothing to go on
    assert cal.estimate(20, used=peak(20) + 140) == 76  # 100 + 10 b + 140 <= 1000
    assert cal.estimate(20, used=peak(20)) == 90  # the ledger was right: its own answer
    assert cal.estimate(20, used=2_000) == 0  # more than is free: not even batch 1, which the search never takes
    no_ledger = Calibration(free_bytes=1_000, ledger_bytes=None)
    assert no_ledger.estimate(1, used=300) is None  # one point is no line
    assert no_ledger.estimate(2, used=300) is None  # and a flat one extrapolates nothing
    assert no_ledger.estimate(4, used=320) == 4 + (1_000 - 320) // 10


def run_limited(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python: an address-space limit lasts for the process that sets it."""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


LIMIT_USED = """
import torch
from perfsweep.memory import limit_address_space, limit_used_bytes
MiB = 2**20
assert limit_used_bytes() is None  # no limit set
x = torch.ones(300 * MiB, dtype=torch.uint8); x[::4096] = 2; del x  # a peak before the limit
limit_address_space(500 * MiB)
print(limit_used_bytes())  # that peak is not the limit's: unknown
y = torch.ones(400 * MiB, dtype=torch.uint8); y[::4096] = 2
print(limit_used_bytes() // MiB)
"""


def test_the_limit_used_is_counted_from_when_it_was_set() -> None:
    """memory_limit_used_bytes is the address-space peak above the size when the limit was set;
    a peak from before it (a process that had shrunk by then) read as 300 MiB of the limit used."""
    unknown, used = run_limited(LIMIT_USED).stdout.split()
    assert unknown == "None" and 400 <= int(used) < 500


PROFILER_UNDER_LIMIT = """
import torch
from perfsweep.config import Device, PerfsweepConfig
from perfsweep.memory import limit_used_bytes, step_alloc_peak_bytes
from perfsweep.runner import apply_memory_limit
apply_memory_limit(PerfsweepConfig(device=Device.cpu, job_memory_limit_mib=300))
step_alloc_peak_bytes(lambda: torch.ones(16).sum())  # what a job's memory step runs first
print(limit_used_bytes() // 2**20)
"""


def test_the_memory_probe_takes_none_of_the_jobs_limit() -> None:
    """The profiler that measures a CPU job's memory maps its libraries on first use: 79 MiB of a
    300 MiB limit here (on an H100 machine's CUDA build every CPU try under it ran out of memory,
    those whose output survives just after their memory step). They are mapped before the
    limit is set, so what the job uses of it is its training's."""
    res = run_limited(PROFILER_UNDER_LIMIT)
    used = res.stdout.split()[-1]
    assert used != "None", "the limit's base came after a higher peak: limit_used_bytes cannot say"
    assert int(used) < 32, res.stdout


PROBE_WITHOUT_ROOM = """
import torch
from perfsweep.memory import limit_address_space
from perfsweep.runner import cpu_matmul_peak
torch.set_num_threads(1)
torch.nn.functional.linear(torch.ones(8, 8), torch.ones(8, 8))  # the training's kernels are loaded
limit_address_space(2**20)  # a training that left 1 MiB of its limit
print(cpu_matmul_peak("fp32"))
"""


def test_a_cpu_peak_probe_without_room_leaves_the_run_without_the_figure() -> None:
    """The CPU matmul peak is measured after the memory figures, under the job's limit: a
    training that fitted, with too little left for the probe's matrices, is not an oom run."""
    res = run_limited(PROBE_WITHOUT_ROOM)
    assert res.stdout.split()[-1] == "None" and "the probe ran out of memory" in res.stderr, res.stderr[-2000:]


def test_search_ends_at_the_cap_when_nothing_runs_out() -> None:
    out = search(oracle(10**9, []), 100, cap=500)
    assert (out.status, out.max_batch, out.first_oom_batch, out.capped) == ("done", 500, None, True)


def test_nothing_fits_and_a_failed_try_end_the_search() -> None:
    assert search(oracle(0, []), 8, cap=64).status == "none_fit"
    out = Outcome()

    def stopped(b: int) -> str:
        if b > 8:
            raise KeyboardInterrupt
        return "ok"

    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C during a try: that try is counted, as stored
        search(stopped, 8, cap=64, out=out)
    assert out.tried == [(8, "ok"), (10, "interrupted")]
    out = search(lambda b: "ok" if b < 10 else "timeout", 8, cap=64)
    assert out.status == "failed" and "batch=10 ended timeout" in out.error and out.max_batch is None
    assert Outcome(status="done").exit_status == "ok" and out.exit_status == "failed"


def test_overrides_of_a_try_and_the_predicted_start() -> None:
    point = ["model=tiny", "batch=max", "sweep.id=3", "sweep.batch_search_id=1"]
    assert with_batch(point, 12, batch_search_id=7) == [
        "model=tiny",
        "sweep.id=3",
        "batch=12",
        "sweep.batch_search_id=7",
    ]
    peak = {b: 100 + 10 * b for b in range(1, 10_000)}  # a ledger: 100 bytes fixed, 10 a sample
    fits = lambda ledger, free: ledger <= free  # noqa: E731
    assert predicted_max_batch(peak.get, 1_000, fits) == 90
    assert predicted_max_batch(peak.get, 50, fits) == 1  # not even batch 1: a job shows it
    assert predicted_max_batch(lambda b: None, 1_000, fits) is None  # no ledger for this model


def test_batch_max_sweep_end_to_end(tmp_path: Path) -> None:
    """Two threads and 400 MiB above start-up per job make the limit reachable on any machine.

    400, not 300: the second try (the ledger's first guess over 1.25) must land clearly below the
    edge, so that its estimate is taken and tried next. Under 300 MiB, once the memory probe no
    longer took 79 MiB of it, that try (256) sat on the edge (253 to 269): when it ran out, the
    first ok try was 128, whose estimate lay above the 256 that had failed and was refused."""
    res = run_perfsweep(
        [
            "-m",
            "model=tiny",
            "data=synthetic",
            "data.synthetic_vocab=2048",
            "batch=max",
            "seq_len=32",
            "threads=2",
            "job_memory_limit_mib=400",
            "steps.warmup=1",
            "steps.stable_window=0",
            "steps.measure=2",
            "profile.enabled=false",
            "device=cpu",
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "perfsweep: 1 batch=max search (a job per batch tried), one process each;" in res.stderr
    # each try's count is the jobs so far, not a total ('[2/2]' read as the last of two), and the
    # sweep's time left, unknowable while the search goes on, is not guessed
    headers = re.findall(r"^\[(\d+)/(\d+)( so far)?\] ", res.stderr, re.MULTILINE)
    assert len(headers) >= 3 and all(int(k) == int(n) and so_far for k, n, so_far in headers), headers
    assert "sweep ~" not in res.stderr and "job ~" in res.stderr
    db = tmp_path / "results.db"
    (found,) = rows(db, "SELECT * FROM batch_searches")
    assert found["status"] == "done" and found["max_batch"] >= 2 and found["first_oom_batch"] == found["max_batch"] + 1
    assert found["predicted_max_batch"] >= 1 and found["free_bytes"] > 0
    tries = rows(db, "SELECT * FROM runs ORDER BY job_num")
    # The ledger counts tensors, the limit the whole address space (it predicted 428 where 371 to
    # 379 fit, 3 runs here); the first ok try's measured use calibrates it, and that batch is tried
    # next. Calibrated, it lands within a few batches of the edge (3 above it in those runs; under
    # 300 MiB 0 to 7 off, docs/benchmarks.md), and within a tenth of it whatever the ledger missed
    # by: 17 below the edge of 380 once in a CI run here, under load, where the ledger said 428;
    # 21 below an edge of 404 under py-spy, where the ledger's 428 was nearer than usual (so
    # "halves the ledger's miss" does not hold: the edge moves with the machine, the ledger not).
    # A calibration that changed nothing fails it at the usual edges (371 to 380: the ledger's 428
    # is 48 or more off); held also to the ledger's own miss, an edge near 420 would fail a sound one.
    first_ok = next(i for i, r in enumerate(tries) if r["status"] == "ok")
    measured = tries[first_ok]["memory_limit_used_bytes"]
    assert tries[first_ok]["peak_allocated_bytes"] < measured <= 400 * 2**20
    calibrated, best = found["calibrated_max_batch"], found["max_batch"]
    predicted = found["predicted_max_batch"]
    assert abs(calibrated - best) <= best // 10, (calibrated, best, predicted)
    oom_before = min([r["batch"] for r in tries[:first_ok] if r["status"] == "oom"], default=10**9)
    assert tries[first_ok + 1]["batch"] == max(tries[first_ok]["batch"] + 1, min(calibrated, oom_before - 1))
    assert "the ledger shifted by that" in res.stderr and "once calibrated by a measured try" in res.stdout
    assert len(tries) == found["n_tried"] >= 2 and {r["batch_search_id"] for r in tries} == {found["id"]}
    for r in tries:  # every try below the limit trained, every one above ran out of memory
        assert r["status"] == ("ok" if r["batch"] <= found["max_batch"] else "oom"), r
        assert r["predicted_peak_bytes"] > 0  # oom rows keep what was predicted
    best = next(r for r in tries if r["id"] == found["best_run_id"])
    assert best["batch"] == found["max_batch"] and best["tokens_per_s"] == found["tokens_per_s"] > 0
    assert f"batch {found['max_batch']} (oom at {found['max_batch'] + 1};" in res.stdout
    subprocess.run(
        [sys.executable, "-m", "perfsweep.report", "--db", "results.db", "--sweep", "1"], cwd=tmp_path, check=True
    )
    md = next(tmp_path.glob("multirun/*/*/report/report.md")).read_text()
    assert "## Largest batch that fits" in md and f"| {found['max_batch']} |" in md
    # a search that found its answer is kept by resume: its tries carry their own batches' config
    # hashes, never the grid point's, and resume searched it all over again, a second answer beside
    res = subprocess.run(
        [sys.executable, "-m", "perfsweep", "resume", "1", "--db", "results.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and "1 of 1 jobs already ok, 0 to run" in res.stderr, res.stderr[-2000:]
    assert len(rows(db, "SELECT id FROM batch_searches")) == 1 and len(rows(db, "SELECT id FROM runs")) == len(tries)


def test_batch_max_needs_a_multirun(tmp_path: Path) -> None:
    res = run_perfsweep(["batch=max", "model=tiny", "device=cpu"], tmp_path)
    assert res.returncode == 2 and "batch=max: searches with several jobs" in res.stderr
    res = run_perfsweep(["-m", "batch=maximum", "model=tiny", "device=cpu"], tmp_path)
    assert res.returncode == 2 and "batch='maximum': must be a positive integer, or max" in res.stderr


def test_a_search_left_running_by_a_dead_sweeper_is_marked_interrupted(tmp_path: Path) -> None:
    from sqlalchemy import update

    from perfsweep import search as search_mod
    from perfsweep import store
    from perfsweep.config import PerfsweepConfig

    engine = store.connect(f"sqlite:///{tmp_path / 'results.db'}")
    sweep_id = store.start_sweep(engine, str(tmp_path / "sweep"), "s")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with store.session(engine) as s:  # the sweeper was that process, which has exited
        s.execute(update(store.Sweep).where(store.Sweep.id == sweep_id).values(pid=int(gone.stdout)))
    search_id = search_mod.begin(engine, sweep_id, 0, ["batch=max"], PerfsweepConfig(batch="max"))
    store.mark_interrupted(engine)
    (row,) = rows(tmp_path / "results.db", f"SELECT status, error FROM batch_searches WHERE id = {search_id}")
    assert row["status"] == "interrupted" and "went away" in row["error"]
    engine.dispose()


def test_a_search_stopped_before_its_first_try_is_stored_as_ended(tmp_path: Path, monkeypatch) -> None:
    """A Ctrl-C while the free memory is read (before any try) left the row 'running' for good;
    any other error there is the search's failure, said in its row."""
    from perfsweep import launcher, store
    from perfsweep import search as search_mod
    from perfsweep.config import PerfsweepConfig

    engine = store.connect(f"sqlite:///{tmp_path / 'results.db'}")
    sweep_id = store.start_sweep(engine, str(tmp_path / "sweep"), "s")
    for fault, status, said in [
        (KeyboardInterrupt(), "interrupted", "the sweep stopped"),
        (OSError("no space left on device"), "failed", "the search stopped: no space left on device"),
    ]:

        def free_bytes(cfg, fault=fault):
            raise fault

        monkeypatch.setattr(launcher, "job_free_bytes", free_bytes)
        with pytest.raises(type(fault)):
            search_mod.run(
                engine, sweep_id, 0, ["batch=max", "repeat=2", "sweep.id=1"], PerfsweepConfig(batch="max"), print
            )
        row = rows(tmp_path / "results.db", "SELECT status, error, overrides FROM batch_searches ORDER BY id")[-1]
        assert (row["status"], row["overrides"]) == (status, "batch=max") and said in row["error"]
    engine.dispose()


@pytest.mark.parametrize("signum", [9, 40])  # SIGKILL, and a real-time signal, which has no name
def test_a_probe_killed_while_it_reads_the_free_memory_is_answered_at_once(tmp_path: Path, signum: int) -> None:
    """A Pool replaced its dead worker and dropped the task: the search waited timeout_s in
    silence, then said 'no ledger for this model'. The pipe's end says at once that it died."""
    import multiprocessing as mp
    import os
    import threading
    import time

    from perfsweep import launcher
    from perfsweep.config import PerfsweepConfig

    got: list = []
    cfg = PerfsweepConfig(device="cpu", timeout_s=120.0)
    reader = threading.Thread(target=lambda: got.append(launcher.job_free_bytes(cfg)))
    t0 = time.monotonic()
    reader.start()
    while not mp.active_children() and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    for child in mp.active_children():
        os.kill(child.pid, signum)
    reader.join(60)
    assert got == [(None, None)] and time.monotonic() - t0 < 30


def test_a_run_imported_later_fills_its_searchs_figures(tmp_path: Path) -> None:
    """The run at max_batch was kept on disk while the database refused it; once imported, the
    sweep's figures are drawn again and the search's copy of them is filled."""
    from perfsweep import search as search_mod
    from perfsweep import store
    from perfsweep.config import PerfsweepConfig
    from perfsweep.summary import fill_sweep_figures
    from tests.util import run_row

    engine = store.connect(f"sqlite:///{tmp_path / 'results.db'}")
    sweep_id = store.start_sweep(engine, str(tmp_path / "sweep"), "s")
    search_id = search_mod.begin(engine, sweep_id, 0, ["batch=max"], PerfsweepConfig(batch="max"))
    search_mod.finish(engine, search_id, Outcome(max_batch=12, first_oom_batch=13, status="done", tried=[(12, "ok")]))
    assert rows(tmp_path / "results.db", "SELECT best_run_id FROM batch_searches")[0]["best_run_id"] is None
    store.save_run(engine, run_row(sweep_id, batch=12, batch_search_id=search_id, tokens_per_s=1234.5))
    fill_sweep_figures(engine, sweep_id)
    (row,) = rows(tmp_path / "results.db", "SELECT best_run_id, tokens_per_s FROM batch_searches")
    assert row["best_run_id"] is not None and row["tokens_per_s"] == 1234.5
    engine.dispose()


def test_resume_refuses_a_grid_whose_plain_point_became_a_search(tmp_path: Path) -> None:
    """Only a search's tries are left out of the same-grid check (their hashes are their batches'):
    a sweep whose point 0 was batch=32, resumed with batch=max there, is another grid."""
    from perfsweep import store
    from perfsweep.config import ConfigError
    from perfsweep.preflight import resume_points
    from tests.util import run_row

    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = store.connect(url)
    sweep_id = store.start_sweep(engine, str(tmp_path / "sweep"), "s", n_jobs=1)
    store.save_run(engine, run_row(sweep_id, job_num=0, batch=32, config_hash="batch32"))
    engine.dispose()
    assert resume_points(url, str(tmp_path / "sweep"), [(0, "batch32")], set()) == {(0, "batch32")}
    with pytest.raises(ConfigError, match="the grid is not that of sweep"):
        resume_points(url, str(tmp_path / "sweep"), [(0, "batchmax")], {0})
