"""Scale out on one machine: several jobs at once in their own slots (launcher.parallel), jobs of
several ranks (nproc, torch.distributed with gloo), and Hydra's other local launchers.

Real sweeps in spawned processes into a real SQLite file; the CPU paths pin device=cpu.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from perfsweep import slots
from perfsweep.config import ConfigError
from perfsweep.names import interrupted_tail
from tests.util import TINY, finish, run_perfsweep, start_as_in_a_terminal, training, wait_for
from tests.util import sqlite_rows as rows

CPUS = slots.usable_cpus()
two_cores = pytest.mark.skipif(len(CPUS) < 2, reason=f"needs 2 CPU cores for 2 slots; this process may use {CPUS}")


# --- slots: pure planning ---------------------------------------------------------------------


def test_slots_split_gpus_and_cores_without_sharing():
    four = slots.plan(2, True, 1, 2, [0, 1, 2, 3, 4, 5, 6, 7], ["0", "1", "2", "3"])
    assert [p.gpus for p in four] == [("0", "1"), ("2", "3")]
    assert [p.cpus for p in four] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert four[1].env() == {"CUDA_VISIBLE_DEVICES": "2,3"}
    # a 1-GPU machine asked for 2 jobs at once: one slot, so the second job waits for it
    one = slots.plan(2, True, 1, 1, [0, 1], ["0"])
    assert len(one) == 1 and one[0].gpus == ("0",) and one[0].cpus is None
    # nproc ranks take a GPU each unless gpus_per_job says otherwise
    assert slots.plan(2, True, 2, None, [0, 1, 2, 3], ["0", "1", "2", "3"])[1].gpus == ("2", "3")
    # CPU: the cores split evenly; one job at a time keeps the machine as it is
    assert [p.cpus for p in slots.plan(2, False, 1, None, [0, 1, 2, 3, 4], [])] == [(0, 1), (2, 3)]
    assert slots.plan(1, False, 1, None, [0, 1], []) == [slots.Placement(0)]
    assert slots.cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_slots_refuse_a_split_that_leaves_a_rank_without_a_device():
    with pytest.raises(
        ConfigError, match=r"launcher.gpus_per_job=2: each job needs 2 GPU\(s\) and this machine shows 1"
    ):
        slots.plan(1, True, 1, 2, [0, 1], ["0"])
    with pytest.raises(ConfigError, match=r"nproc=2: .* need a CPU core per rank and this process may use 1 \(0\)"):
        slots.plan(1, False, 2, None, [0], [])
    with pytest.raises(ConfigError, match=r"launcher.parallel=3: .* may use 2 \(0-1\)"):
        slots.plan(3, False, 1, None, [0, 1], [])


def test_whether_torch_sees_a_gpu_is_read_without_importing_it(tmp_path: Path):
    """The sweep's process answers torch.cuda.is_available() from torch's own version.py where
    the build decides it (no CUDA, no ROCm: no GPU anywhere) and asks torch only for a GPU build;
    a file it cannot read for certain (a value computed, a name missing) leaves torch to say."""
    import torch

    assert slots.torch_build() == {
        "__version__": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
    }
    assert slots.cuda_available() == torch.cuda.is_available()
    assert slots.torch_version() == torch.__version__
    gpu_build = "from typing import Optional\n__version__ = '2.13.0+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n"
    (tmp_path / "gpu.py").write_text(gpu_build)
    assert slots.read_torch_build(tmp_path / "gpu.py") == {"__version__": "2.13.0+cu128", "cuda": "12.8", "hip": None}
    (tmp_path / "computed.py").write_text(gpu_build.replace("cuda: Optional[str] = '12.8'", "cuda = _find()"))
    (tmp_path / "no_hip.py").write_text(gpu_build.replace("hip = None\n", ""))
    (tmp_path / "broken.py").write_text("cuda = (")
    for name in ("computed", "no_hip", "broken", "absent"):
        assert slots.read_torch_build(tmp_path / f"{name}.py") == {}, name


def test_slot_pool_makes_a_job_wait_for_a_free_slot():
    import threading

    pool = slots.SlotPool([slots.Placement(0), slots.Placement(1)])
    a, b = pool.acquire(), pool.acquire()
    got: list[slots.Placement] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire()))
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive() and not got  # both slots taken: the third job waits
    pool.release(b)
    waiter.join(timeout=5)
    assert got == [b] and a.slot == 0


# --- launcher.parallel: real sweeps -----------------------------------------------------------


@two_cores
@pytest.mark.slow
def test_two_jobs_at_once_each_on_its_own_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """3 grid points, 2 slots: two jobs run side by side on disjoint cores, the third waits for a
    slot; every row is stored once with the cores it had."""
    # the thread count must come from the slot: tests/conftest.py's share of the cores for 2
    # workers on 2 cores is the same 1, and passed the check with the slot's count ignored
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    tiny = [o for o in TINY if not o.startswith("steps.measure")]
    res = run_perfsweep(
        ["-m", "launcher.parallel=2", "device=cpu", "steps.measure=12", "seed=0,1,2", *tiny], tmp_path, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "3 jobs, one process each, 2 at a time" in res.stderr
    assert "Up to 2 jobs ran at a time on this machine (launcher.parallel)" in res.stdout
    db = tmp_path / "results.db"
    runs = rows(
        db,
        "SELECT job_num, status, run_uid, cpu_affinity, cpus_allotted, torch_threads, nproc, global_batch, "
        "started_at, finished_at, tokens_per_s FROM runs ORDER BY job_num",
    )
    assert [r["job_num"] for r in runs] == [0, 1, 2]  # none lost, none twice
    assert len({r["run_uid"] for r in runs}) == 3
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in runs)
    per_slot = len(CPUS) // 2
    assert all(r["cpus_allotted"] == per_slot and r["torch_threads"] == per_slot for r in runs)
    assert all(r["nproc"] is None and r["global_batch"] == 4 for r in runs)  # plain single processes
    assert runs[0]["cpu_affinity"] != runs[1]["cpu_affinity"]  # side by side on disjoint cores
    assert runs[0]["started_at"] < runs[1]["finished_at"] and runs[1]["started_at"] < runs[0]["finished_at"]
    first_free = min(runs[0]["finished_at"], runs[1]["finished_at"])
    assert runs[2]["started_at"] >= first_free  # the third waited for a slot
    sweep = rows(db, "SELECT parallel, hydra_launcher, status FROM sweeps")[0]
    assert sweep == {"parallel": 2, "hydra_launcher": "BasicLauncher", "status": "done"}
    # launcher.* says how the sweep ran, not what was measured: no job folder or label carries it
    assert not any("launcher" in p.name for p in next((tmp_path / "multirun").glob("*/*")).iterdir())


def test_parallel_beyond_the_cores_is_refused_before_any_job(tmp_path: Path):
    too_many = len(CPUS) + 1
    res = run_perfsweep(["-m", f"launcher.parallel={too_many}", "device=cpu", "amp=true,false", *TINY], tmp_path)
    assert res.returncode == 2
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("perfsweep:")]
    assert len(line) == 1 and f"launcher.parallel={too_many}" in line[0] and "no job was started" in line[0], line
    assert not (tmp_path / "results.db").exists()


@two_cores
@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "ctrl-c-while-starting", "ctrl-c-twice", "ctrl-c-then-sigterm", "sigterm"])
def test_stopping_the_sweep_stops_every_running_job_and_marks_it(how: str, tmp_path: Path):
    """Ctrl-C (SIGINT to the whole process group, jobs included: once they train, while they
    still import torch, twice in a row, or followed by a SIGTERM) or SIGTERM to the sweep alone:
    both jobs in flight are stopped and stored interrupted with a one-line reason, and so is the
    sweep; the two jobs not started are counted in the summary (which a second signal skips), the
    exit code is the first signal's, the last line names the resume command, and no process is left."""
    tiny = [o for o in TINY if not o.startswith("steps.measure")]
    said = tmp_path / "stderr.txt"
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "-m", "launcher.parallel=2", "device=cpu", "amp=true,false"]
        + ["ckpt=true,false", "steps.measure=100000000", *tiny],
        tmp_path,
        stderr_file=said,
    )
    db = tmp_path / "results.db"
    # both jobs have their rows: their processes are starting
    wait_for(lambda: db.exists() and rows(db, "SELECT count(*) AS n FROM runs WHERE status = 'running'")[0]["n"] == 2)
    if how != "ctrl-c-while-starting":
        wait_for(lambda: training(said, "[1/4]", "[2/4]"))  # both train
    if how.startswith("ctrl-c"):
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    if how == "ctrl-c-twice":  # while the jobs stop: it once left them and the sweep 'running'
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
    if how == "ctrl-c-then-sigterm":  # a SIGTERM cut the stopping short too, and made the exit 143
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
    out, err = finish(proc, 90)
    assert proc.returncode == (143 if how == "sigterm" else 130), err[-2000:]  # never killed by the second
    runs = rows(db, "SELECT status, error FROM runs")
    assert [r["status"] for r in runs] == ["interrupted", "interrupted"], runs
    first, other = ("SIGTERM", "SIGINT") if how == "sigterm" else ("SIGINT", "SIGTERM")
    for r in runs:  # what stopped the job first, in one line: no traceback of where it was
        assert "\n" not in r["error"] and r["error"].endswith(interrupted_tail(multirun=True)), r["error"]
        assert r["error"].startswith("interrupted (") and first in r["error"] and other not in r["error"], r["error"]
    assert [r["status"] for r in rows(db, "SELECT status FROM sweeps")] == ["interrupted"]
    if not how.startswith("ctrl-c-t"):
        assert "(2 runs, 0 ok; 2 of 4 jobs not started)" in out
        assert " job amp ckpt " in out  # both jobs ran amp on: the grid's axes, not only those they vary
    elif "perfsweep: stopping the running jobs and storing them first" in err:
        assert "Sweep 1" not in out  # held while the jobs were stopped, then raised: no summary
    assert (
        err.strip().splitlines()[-1].endswith(f"; no job had finished; run them with: perfsweep resume 1 --db {db}")
    ), err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]  # a signal lost in a finalizer
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("a process of the stopped sweep is still running")


# --- nproc: data-parallel jobs (gloo on CPU) --------------------------------------------------

TWO_RANKS = ["nproc=2", "device=cpu", "steps.stable_window=2"]  # warmup ends when both ranks agree


@two_cores
@pytest.mark.slow
def test_two_rank_gloo_job_stores_global_and_per_rank_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # each rank's threads from its share, not tests/conftest.py's
    tiny = [o for o in TINY if not o.startswith(("steps.stable_window", "profile.active"))]
    res = run_perfsweep([*TWO_RANKS, "profile.active=2", *tiny], tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    db = tmp_path / "results.db"
    (run,) = rows(db, "SELECT * FROM runs")
    assert run["status"] == "ok" and run["nproc"] == 2 and run["global_batch"] == 8
    # the global batch's tokens over the window of the slowest rank's steps
    window_tokens = 8 * 32 * run["measure_steps"]
    assert run["tokens_per_s"] == pytest.approx(window_tokens / (run["measure_wall_ms"] / 1000), rel=1e-6)
    assert run["slowest_rank"] in (0, 1) and run["slowest_rank_step_time_ms_median"] > 0
    assert run["step_time_ms_median"] >= run["slowest_rank_step_time_ms_median"] * 0.999  # max over ranks per step
    assert run["allreduce_ms_per_step"] > 0  # gloo's allreduce ranges in rank 0's trace
    assert run["cpus_allotted"] == len(CPUS)  # the job's cores (the row is the job's) ...
    assert run["torch_threads"] == len(CPUS) // 2  # ... split between its ranks
    steps = rows(db, "SELECT phase, count(*) AS n FROM steps GROUP BY phase")
    assert {s["phase"]: s["n"] for s in steps}["measure"] == run["measure_steps"]
    job_dir = Path(run["job_dir"])
    assert (job_dir / "rank1").is_dir() and list(job_dir.glob("trace_*.json.gz"))  # rank 0 profiled
    assert rows(db, "SELECT count(*) AS n FROM stages")[0]["n"] == 5


USER_MODEL = """
import os
import torch
from torch import nn


def build(vocab_size, seq_len):
    return Broken(vocab_size)


class Broken(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 16)
        self.head = nn.Linear(16, vocab_size)
        self.steps = 0

    def forward(self, idx, targets):
        self.steps += 1
        if os.environ.get("RANK") == "1" and self.steps == 3:
            raise RuntimeError("rank one broke on its third step")
        logits = self.head(self.emb(idx))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
"""


@two_cores
@pytest.mark.slow
def test_a_failing_rank_fails_the_run_with_its_error(tmp_path: Path):
    (tmp_path / "brokenmodel.py").write_text(USER_MODEL)
    tiny = [o for o in TINY if not o.startswith(("model=", "steps.stable_window"))]
    started = time.monotonic()
    res = run_perfsweep([*TWO_RANKS, "model=custom", "model._target_=brokenmodel.build", *tiny], tmp_path, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    (run,) = rows(tmp_path / "results.db", "SELECT status, error, nproc FROM runs")
    assert run["status"] == "failed" and run["nproc"] == 2
    assert run["error"].startswith("rank 1: RuntimeError: rank one broke on its third step"), run["error"]
    assert time.monotonic() - started < 120  # rank 0, waiting in its allreduce, was stopped


@two_cores
@pytest.mark.slow
def test_a_rank_killed_mid_training_is_named_not_the_rank_whose_collective_broke(tmp_path: Path):
    """Rank 1 killed by SIGKILL (a user, the kernel's OOM killer) writes nothing; rank 0's
    allreduce then fails and writes ``Connection reset by peer``, and that was the stored error.
    The killed rank is named, with the OOM killer's count read as for a killed job process."""
    model = USER_MODEL.replace(
        'raise RuntimeError("rank one broke on its third step")', "os.kill(os.getpid(), 9)  # SIGKILL, as `kill -9`"
    )
    (tmp_path / "brokenmodel.py").write_text(model)
    tiny = [o for o in TINY if not o.startswith(("model=", "steps.stable_window"))]
    res = run_perfsweep([*TWO_RANKS, "model=custom", "model._target_=brokenmodel.build", *tiny], tmp_path, timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    (run,) = rows(tmp_path / "results.db", "SELECT status, error FROM runs")
    assert run["status"] == "failed" and run["error"].startswith("rank 1 killed by SIGKILL"), run["error"]


def test_profile_ranks_and_slurm_gpus_must_fit_the_job():
    from hydra_plugins.perfsweep_sweeper import _check_gpus_per_job
    from perfsweep.config import PerfsweepConfig, ProfileConfig

    with pytest.raises(ConfigError, match=r"profile.ranks=\[1\]: must include 0 .* 0 to 1 \(nproc=2\)"):
        PerfsweepConfig(nproc=2, profile=ProfileConfig(ranks=[1]))
    with pytest.raises(ConfigError, match=r"profile.ranks=\[0, 2\]: .* 0 to 1"):
        PerfsweepConfig(nproc=2, profile=ProfileConfig(ranks=[0, 2]))
    PerfsweepConfig(nproc=2, profile=ProfileConfig(ranks=[0, 1]))
    cuda4 = [PerfsweepConfig(nproc=4, device="cuda"), PerfsweepConfig(device="cuda")]
    with pytest.raises(ConfigError, match=r"hydra.launcher.gpus_per_node=1: a job of nproc=4 .*gpus_per_node=4"):
        _check_gpus_per_job({"gpus_per_node": 1}, cuda4)
    _check_gpus_per_job({"gpus_per_node": 4}, cuda4)
    _check_gpus_per_job({"gpus_per_node": 1}, [PerfsweepConfig(nproc=4, device="cpu")])  # gloo: no GPUs needed


def test_more_ranks_than_cores_is_refused_before_any_job(tmp_path: Path):
    res = run_perfsweep([f"nproc={len(CPUS) + 1}", "device=cpu", *TINY], tmp_path)
    assert res.returncode == 2
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("perfsweep:")]
    assert len(line) == 1 and f"nproc={len(CPUS) + 1}" in line[0] and "CPU core per rank" in line[0], line


# --- Hydra's other local launchers ------------------------------------------------------------


@pytest.mark.slow
def test_joblib_launcher_runs_every_job_in_a_spawned_process(tmp_path: Path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="hydra-joblib-launcher not installed")
    res = run_perfsweep(
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "device=cpu", "amp=true,false", *TINY],
        tmp_path,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    db = tmp_path / "results.db"
    runs = rows(db, "SELECT job_num, status, error FROM runs ORDER BY job_num")
    assert [(r["job_num"], r["status"]) for r in runs] == [(0, "ok"), (1, "ok")], runs
    sweep = rows(db, "SELECT parallel, hydra_launcher, command FROM sweeps")[0]
    assert sweep["hydra_launcher"] == "JoblibLauncher" and sweep["parallel"] == 2
    assert sweep["command"].startswith("perfsweep -m hydra/launcher=joblib")
    assert "Up to 2 jobs ran at a time on this machine (JoblibLauncher)" in res.stdout
