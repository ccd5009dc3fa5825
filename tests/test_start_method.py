"""How a job's process starts (launcher.start_method): forked from the sweep's job server on the
CPU, spawned where its environment differs or where asked; either way a process of its own.

Real sweeps through the CLI, a user's model module that keeps state at module level, and the
database's ``runs.start_method``. The CUDA side (auto spawns there) is in tests/test_gpu.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_custom_model import USER_MODEL
from tests.util import (
    TINY,
    finish,
    in_group,
    job_process,
    job_server,
    run_perfsweep,
    sqlite_rows,
    start_as_in_a_terminal,
)

CPU = [*TINY, "device=cpu"]  # asserts the CPU's choice: auto forks CPU jobs, spawns CUDA ones

LEAKY = (
    textwrap.dedent(USER_MODEL)
    + """
import multiprocessing
import os
import sys

BUILDS = []
\"\"\"Module state an earlier job would leave behind, were a job started from it.\"\"\"


def leaky(vocab_size):
    BUILDS.append(vocab_size)
    me = multiprocessing.current_process().name
    if me.startswith("perfsweep-job-"):  # not the sweep's own checks of the factory
        with open(os.environ["LEAKY_LOG"], "a") as f:
            seen = (me, os.getpid(), len(BUILDS), int("torch._dynamo" in sys.modules), os.environ.get("JOB_TAG"))
            f.write(" ".join(map(str, seen)) + "\\n")
    return Logits(vocab_size)
"""
)
"""tests/test_custom_model.py's user module (its ``Logits``: a bigram) with a factory that
records, in LEAKY_LOG, the job, its pid, the builds its module has seen, whether torch's Dynamo
was imported before it, and JOB_TAG."""


def _user_sweep(
    tmp_path: Path, *overrides: str, env: dict[str, str] | None = None
) -> tuple[list[dict], list[list[str]]]:
    (tmp_path / "usermodels.py").write_text(LEAKY)
    log = tmp_path / "builds.txt"
    res = run_perfsweep(
        ["-m", "model=custom", "model._target_=usermodels.leaky", "model.loss=cross_entropy", "seed=0,1", *overrides]
        + [o for o in CPU if not o.startswith("model=")],
        tmp_path,
        env={"LEAKY_LOG": str(log), **(env or {})},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sqlite_rows(tmp_path / "results.db", "SELECT job_num, status, start_method FROM runs ORDER BY job_num")
    return runs, [line.split() for line in log.read_text().splitlines()]


def _per_job(builds: list[list[str]]) -> dict[str, list[list[str]]]:
    """The builds' lines by job name; each line: name, pid, builds so far, Dynamo imported, JOB_TAG."""
    jobs: dict[str, list[list[str]]] = {}
    for line in builds:
        jobs.setdefault(line[0], []).append(line[1:])
    return jobs


def _fresh(jobs: dict[str, list[list[str]]]) -> bool:
    """Each job a process of its own whose module counted its builds from 1 (a job builds the
    model more than once: for its figures, then to train)."""
    pids = [{line[0] for line in lines} for lines in jobs.values()]
    counts = [[int(line[1]) for line in lines] for lines in jobs.values()]
    return (
        all(len(p) == 1 for p in pids)
        and len(set.union(*pids)) == len(jobs)
        and all(c == list(range(1, len(c) + 1)) for c in counts)
    )


@pytest.mark.parametrize("early", ["1", "0"], ids=["server-early", "server-with-the-first-job"])
def test_cpu_jobs_fork_from_the_job_server_and_share_nothing(early: str, tmp_path: Path):
    """Two jobs of one sweep: each forked (torch and Dynamo already imported when the user's
    module is), each its own process, and each builds the model as the first build of a freshly
    imported module: nothing of the job before it is there. Whenever the server started: the
    sweep imports Dynamo to check the user's model after an early server has started, and torch
    then makes the user's relative TORCHINDUCTOR_CACHE_DIR absolute in the sweep, which made
    every job spawned (a review found it)."""
    env = {"PERFSWEEP_EARLY_JOB_SERVER": early, "TORCHINDUCTOR_CACHE_DIR": "inductor-cache"}
    runs, builds = _user_sweep(tmp_path, env=env)
    assert [(r["status"], r["start_method"]) for r in runs] == [("ok", "forkserver")] * 2
    jobs = _per_job(builds)
    assert sorted(jobs) == ["perfsweep-job-0", "perfsweep-job-1"] and _fresh(jobs), builds
    assert {line[3] for line in builds} == {"1"}  # Dynamo was there before the job imported anything


def test_spawn_is_a_new_interpreter_per_job(tmp_path: Path):
    runs, builds = _user_sweep(tmp_path, "launcher.start_method=spawn")
    assert [(r["status"], r["start_method"]) for r in runs] == [("ok", "spawn")] * 2
    jobs = _per_job(builds)
    assert len(jobs) == 2 and _fresh(jobs), builds
    assert {line[3] for line in builds} == {"0"}  # Dynamo comes later, with the job's optimizer


def test_a_jobs_time_besides_its_steps_is_split_and_a_spawned_start_shows_in_it(tmp_path: Path):
    """runs.process_start_ms, setup_ms and after_steps_ms (perfsweep.metrics.JobClock): with the
    steps they account for the job's duration_s but for the data's preparation and the running
    row's insert (98% and 99.7% on the 2-core VM), and a spawned job's start, which imports torch,
    is the one that takes long (1,171 ms against 14 ms forked there). The server starts with the
    sweep, and the spawned job runs first: by the forked job's turn the server has imported torch,
    so its start does not wait for that."""
    res = run_perfsweep(
        ["-m", "launcher.start_method=spawn,forkserver", "profile.enabled=true", *CPU],
        tmp_path,
        env={"PERFSWEEP_EARLY_JOB_SERVER": "1"},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    spawned, forked = sqlite_rows(
        tmp_path / "results.db",
        "SELECT start_method, duration_s, process_start_ms, setup_ms, after_steps_ms, first_step_ms, "
        "measure_wall_ms, warmup_steps FROM runs ORDER BY job_num",
    )
    assert (spawned["start_method"], forked["start_method"]) == ("spawn", "forkserver")
    for run in (spawned, forked):
        parts = [run[k] for k in ("process_start_ms", "setup_ms", "first_step_ms", "measure_wall_ms", "after_steps_ms")]
        assert all(p > 0 for p in parts) and run["warmup_steps"] == 1, run  # TINY: one warmup step, then the window
        duration_ms = run["duration_s"] * 1000
        # all on one clock but duration_s (the wall clock): 50 ms for the two clocks' drift; what is
        # not in the parts (a SQLite insert, the data) may take a slow disk a quarter of a second
        assert duration_ms - max(250, 0.2 * duration_ms) <= sum(parts) <= duration_ms + 50, run
    assert forked["process_start_ms"] * 4 < spawned["process_start_ms"], (spawned, forked)


def test_a_job_given_environment_variables_is_spawned_with_them(tmp_path: Path):
    """Hydra's ``hydra.job.env_set``, here a value per job: torch reads some variables on import
    (OpenMP's threads, TORCH_LOGS), which a forked job would take from the server, and Hydra sets
    and unsets them in the sweep's process as it hands out jobs. Every job is spawned, and each
    sees its own value."""
    runs, builds = _user_sweep(tmp_path, "+hydra.job.env_set.JOB_TAG=tag${hydra:job.num}")
    assert [(r["status"], r["start_method"]) for r in runs] == [("ok", "spawn")] * 2
    jobs = _per_job(builds)
    assert {name: {line[3] for line in lines} for name, lines in jobs.items()} == {
        f"perfsweep-job-{i}": {f"tag{i}"} for i in range(2)
    }
    assert _fresh(jobs), builds


def test_a_job_that_imported_another_perfsweep_refuses_to_run(tmp_path: Path):
    """A job server's interpreter resolves its imports by its own sys.path; had it found another
    copy of perfsweep than the sweep's, its jobs would run other code. The job fails saying so."""
    import multiprocessing as mp
    import subprocess
    import sys

    from perfsweep import job_entry

    receive, send = mp.Pipe(duplex=False)
    elsewhere = str(tmp_path / "elsewhere" / "perfsweep" / "__init__.py")
    script = (
        "import sys; from multiprocessing.connection import Connection; from perfsweep import job_entry; "
        f"job_entry.main({str(tmp_path / 'job')!r}, Connection({send.fileno()}), b'', 'forkserver', {elsewhere!r})"
    )
    subprocess.run([sys.executable, "-c", script], pass_fds=[send.fileno()], check=True, timeout=120)
    send.close()
    kind, status, why, _, partial = receive.recv()
    assert (kind, status, partial) == ("error", "failed", {"start_method": "forkserver"})
    assert why.startswith(f"this job imported perfsweep from {Path(job_entry.__file__).parent / '__init__.py'}")
    assert f"the sweep from {elsewhere} (forkserver)" in why and "launcher.start_method=spawn" in why


SLOW = (
    textwrap.dedent(USER_MODEL)
    + """
import time


class SlowLogits(Logits):
    \"\"\"Steps of 0.7 s: the job says nothing to the sweep for longer than the 0.5 s it polls.\"\"\"

    def forward(self, idx, targets=None):
        time.sleep(0.7)
        return super().forward(idx, targets)


def slow(vocab_size):
    return SlowLogits(vocab_size)
"""
)


@pytest.mark.parametrize("signum", [signal.SIGUSR2, signal.SIGKILL], ids=["sigusr2", "sigkill"])
def test_a_jobs_result_outlives_its_job_servers_signal(signum: int, tmp_path: Path):
    """SLURM sends SIGUSR2 to every process of a job step as submitit's warning that the time
    limit is near. A job server it ended left the sweep unable to tell how its jobs exit:
    multiprocessing reports 255 for a job still training, and a job silent for 0.7 s (a slow
    step) was stored failed. The server ignores it, as the job does. A server killed outright
    (SIGKILL) is the same case: the sweep then watches the job's own pid. Either way the job
    trains on, its result is stored, and the next job gets a new server."""
    import sys

    (tmp_path / "usermodels.py").write_text(SLOW)
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "-m", "model=custom", "model._target_=usermodels.slow"]
        + ["model.loss=cross_entropy", "seed=0,1" if signum == signal.SIGKILL else "seed=0"]
        + ["steps.measure=2", "profile.enabled=false"]
        + [o for o in CPU if not o.startswith(("model=", "steps.measure", "profile."))],
        tmp_path,
    )
    try:
        job = job_process(proc.pid)  # the first job is forked once the server has imported torch
        server = job_server(proc.pid)
        os.kill(server, signum)
        if signum == signal.SIGUSR2:  # the job's own handling, as on SLURM where every process gets it
            os.kill(job, signum)
            time.sleep(0.5)
            state = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state not in ("Z", "X"), "the job server did not outlive SIGUSR2"
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    out, err = finish(proc, 300)
    assert proc.returncode == 0, err[-3000:]
    runs = sqlite_rows(tmp_path / "results.db", "SELECT status, error, start_method FROM runs")
    jobs = 2 if signum == signal.SIGKILL else 1  # after a SIGKILL the next job needs a new server
    assert [(r["status"], r["error"], r["start_method"]) for r in runs] == [("ok", None, "forkserver")] * jobs


def test_a_signal_held_while_a_job_starts_stops_that_job_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Ctrl-C or SIGTERM that comes while a job is being started is held (the job must start
    with both blocked) and raised once it has started. The sweep lost the job then: it stored
    the run interrupted and exited, and the job, which a SIGTERM to the sweep alone never
    reached, trained on unwatched until its next progress line found the sweep gone and died of
    a BrokenPipeError (its traceback in job.log), the sweep's exit waiting for that (3 s steps
    here). The SIGTERM comes from inside the start (a driver wraps the block that holds it). The
    sweep now stops the job as it stops a running one, and nothing it started outlives it."""
    import sys

    (tmp_path / "usermodels.py").write_text(SLOW.replace("time.sleep(0.7)", "time.sleep(3.0)"))
    monkeypatch.setenv("PERFSWEEP_EARLY_JOB_SERVER", "0")  # the server starts with the first job
    driver = (
        "import contextlib, os, signal, sys\n"
        "from perfsweep import launcher\n"
        "real = launcher.signals_blocked\n"
        "@contextlib.contextmanager\n"
        "def blocked():\n"
        "    with real():\n"
        "        yield\n"
        "        os.kill(os.getpid(), signal.SIGTERM)  # to the sweep alone, held: the job has started\n"
        "launcher.signals_blocked = blocked\n"
        "sys.argv = ['perfsweep', *sys.argv[1:]]\n"
        "from perfsweep.__main__ import cli\n"
        "cli()\n"
    )
    proc = start_as_in_a_terminal(
        [sys.executable, "-c", driver, "-m", "model=custom", "model._target_=usermodels.slow"]
        + ["model.loss=cross_entropy", "steps.measure=2", "profile.enabled=false"]
        + [o for o in CPU if not o.startswith(("model=", "steps.measure", "profile."))],
        tmp_path,
    )
    out, err = finish(proc, 120)
    time.sleep(0.5)  # the job server ends as the sweep does
    left = in_group(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"processes the sweep started outlived it: {left}"
    assert proc.returncode == 143, err[-3000:]
    runs = sqlite_rows(tmp_path / "results.db", "SELECT status, error FROM runs")
    assert [r["status"] for r in runs] == ["interrupted"] and runs[0]["error"].startswith("interrupted (SIGTERM)"), runs
    assert "Traceback" not in err, err[-3000:]
    (log,) = tmp_path.glob("multirun/*/*/*/job.log")
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]  # stopped, not cut off


@pytest.mark.parametrize(
    ("server", "signum", "parallel"),
    [("early", signal.SIGINT, 1), ("with-the-first-job", signal.SIGTERM, 1), ("with-the-first-job", signal.SIGINT, 2)],
    ids=["early-ctrl-c", "with-the-first-job-sigterm", "two-at-a-time-ctrl-c"],
)
def test_a_signal_while_the_job_server_imports_stops_the_sweep_at_once(
    server: str, signum: int, parallel: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A request to the job server for a process (the CPU's matmul peak, a job) is made with
    Ctrl-C and SIGTERM blocked, and the server answers only once its imports are done: a Ctrl-C
    meanwhile waited for them (up to 1.1 s on a 2-core VM, 2026-11-28; longer for a CUDA
    build of torch on a cold disk). The sweep now waits for the server's word that its imports
    are done (perfsweep.job_server_ready) before the request, free to stop. The server is
    stopped here (SIGSTOP) before its imports end, so a sweep that waits for them never ends:
    it must end at once, with nothing it started left, no job started, and no traceback. Early:
    the server started as the grid was composed, the request the CPU peak's; with the first job:
    the request the job's, the signal a SIGTERM to the sweep alone. Two at a time
    (launcher.parallel=2): the request is made in a job's thread, which takes no signal; the
    sweep stopping must end its wait too (it held the sweep for ever)."""
    import sys

    monkeypatch.setenv("PERFSWEEP_EARLY_JOB_SERVER", "1" if server == "early" else "0")
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "-m", *CPU, "seed=0,1", f"launcher.parallel={parallel}"], tmp_path
    )
    stopped = None
    try:
        stopped = job_server(proc.pid)  # its imports take a second or more: stopped well before they end
        os.kill(stopped, signal.SIGSTOP)
        time.sleep(2.0)  # the sweep reaches its request (0.1 to 0.5 s after the server starts)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # as a terminal's Ctrl-C: the stopped server gets it too
        else:
            os.kill(proc.pid, signum)
        sent = time.monotonic()
        out, err = finish(proc, 30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
    time.sleep(0.5)
    left = in_group(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert not left, f"processes the sweep started outlived it: {left}"
    assert proc.returncode == 128 + signum, err[-3000:]
    assert took < 10, f"the sweep took {took:.1f} s to end after the signal"
    assert "Traceback" not in err, err[-3000:]
    assert not list(tmp_path.glob("multirun/*/*/*/job.log")), "a job started"
    db = tmp_path / "results.db"
    runs = sqlite_rows(db, "SELECT status FROM runs") if db.exists() else []
    assert {r["status"] for r in runs} <= {"interrupted"}, runs


def test_the_wait_for_the_job_servers_imports_is_once_per_server_and_ends_with_it(tmp_path: Path):
    """What :func:`perfsweep.job_start.wait_until_ready` must not do, each found by a review:
    wait again for a server it saw ready (a ready file removed meanwhile, by a cleaner of /tmp,
    cost every later job 60 s, stored in its process_start_ms); wait for a forkserver the
    process had before perfsweep's (a notebook's own, which never says it is ready: 60 s a job);
    wait on a server that died while it imported (the request then restarted it with signals
    blocked, and a Ctrl-C waited for the new one's imports): it raises OSError, and the job is
    spawned, as where the request fails. The server is stopped (SIGSTOP) before it could be
    ready, then killed."""
    script = (
        "import os, shutil, signal, threading, time\n"
        "from perfsweep import job_start\n"
        "from perfsweep.config import Device, PerfsweepConfig\n"
        "os.environ['PERFSWEEP_EARLY_JOB_SERVER'] = '1'\n"
        "assert job_start.start_early([PerfsweepConfig(device=Device.cpu)], {})\n"
        "t = time.monotonic(); job_start.server_ready(); first = time.monotonic() - t\n"
        "shutil.rmtree(os.path.dirname(job_start._ready_file))  # a cleaner of /tmp\n"
        "t = time.monotonic(); job_start.server_ready(); again = time.monotonic() - t\n"
        "server = job_start._server_pid()\n"
        "os.kill(server, signal.SIGKILL); os.waitid(os.P_PID, server, os.WEXITED | os.WNOWAIT)\n"
        "killer = threading.Timer(0.5, lambda: os.kill(job_start._server_pid(), signal.SIGKILL))\n"
        "job_start._start_server()  # a new one, which is stopped before its imports end\n"
        "os.kill(job_start._server_pid(), signal.SIGSTOP)\n"
        "killer.start()\n"
        "try:\n"
        "    job_start.wait_until_ready()\n"
        "    died = 'no error'\n"
        "except OSError as exc:\n"
        "    died = str(exc)\n"
        "print(f'{first:.2f} {again:.3f}')\n"
        "print(died)\n"
    )
    times, died = _printed(script, tmp_path)
    first, again = times.split()
    assert float(first) > 0.2 and float(again) < 0.2, times  # the imports took a while; no second wait
    assert died.startswith("perfsweep's job server (pid ") and died.endswith("ended while it imported torch"), died

    foreign = (  # a forkserver of the process's own, started before perfsweep's sweep
        "import multiprocessing as mp, os, time\n"
        "from perfsweep import job_start\n"
        "p = mp.get_context('forkserver').Process(target=os.getpid); p.start(); p.join()\n"
        "t = time.monotonic(); job_start.server_ready(); print(f'{time.monotonic() - t:.3f}')\n"
        "print(int(job_start._server_pid() == mp.forkserver._forkserver._forkserver_pid))\n"
    )
    took, same = _printed(foreign, tmp_path)
    assert float(took) < 0.5 and same == "1", (took, same)


def _printed(script: str, cwd: Path) -> list[str]:
    """The lines ``python -c script`` printed in ``cwd``; it must exit 0."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.splitlines()


def test_what_the_sweep_needs_torch_for_is_forked_from_the_job_server(tmp_path: Path):
    """The sweep's own work with torch before its jobs (the CPU's matmul peak, a check of a user's
    model) runs in a process forked from the job server where the jobs will be forked from it, so
    the sweep's process never imports torch (1 to 2 CPU-seconds of every sweep): the server is
    started then if a busy machine left it unstarted. Where no job forks (spawn), or the server is
    left to the first job (PERFSWEEP_EARLY_JOB_SERVER=0), it runs in the sweep. What it raises is
    raised in the sweep; a process that dies without answering is one RuntimeError."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from perfsweep import cpu_peak, job_start\n"
        "from perfsweep.config import Device, PerfsweepConfig, StartMethod\n"
        "spawned = PerfsweepConfig(device=Device.cpu)\n"
        "spawned.launcher.start_method = StartMethod.spawn\n"
        "os.environ['PERFSWEEP_EARLY_JOB_SERVER'] = '1'\n"
        "assert not job_start.start_early([spawned], {})  # no job would fork: no server\n"
        "assert job_start.call(os.getpid) == os.getpid()\n"
        "os.environ['PERFSWEEP_EARLY_JOB_SERVER'] = '0'\n"
        "assert not job_start.start_early([PerfsweepConfig(device=Device.cpu)], {})  # with the first job\n"
        "assert job_start.call(os.getpid) == os.getpid() and job_start._server_pid() is None\n"
        "del os.environ['PERFSWEEP_EARLY_JOB_SERVER']\n"
        "job_start.spare_core = lambda: False  # a busy machine: not started early...\n"
        "assert not job_start.start_early([PerfsweepConfig(device=Device.cpu)], {})\n"
        "assert job_start._server_pid() is None\n"
        "there = job_start.call(os.getpid)  # ...but when the sweep first needs torch\n"
        "server = job_start._server_pid()\n"
        "assert server is not None and there not in (os.getpid(), server), (there, server)\n"
        "maps = open(f'/proc/{server}/maps').read()\n"
        "from pathlib import Path\n"
        "assert job_start.call(Path.read_text, Path('/proc/self/comm')) == 'perfsweep-check\\n'  # not a job, to ps\n"
        "fields = job_start.call(cpu_peak.sweep_fields, 1, {'fp32'})\n"
        "try:\n"
        "    job_start.call(int, 'x')\n"
        "except ValueError as exc:\n"
        "    raised = str(exc)\n"
        "try:\n"
        "    job_start.call(os._exit, 3)\n"
        "except RuntimeError as exc:\n"
        "    died = str(exc)\n"
        "print(int('libtorch_cpu' in maps), int(fields['cpu_matmul_fp32_flops'] > 0), fields['cpu_matmul_threads'])\n"
        "print(raised)\n"
        "print(died)\n"
        "print(int('torch' in sys.modules))\n"
        "import gcprobe\n"
        "print(*job_start.call(gcprobe.state), job_start.call(gcprobe.in_a_grandchild))\n"
    )
    # the server imports with the garbage collector off, and freezes what it made as it forks: a
    # process it forks collects as usual, over its own objects only; one that process forks (a
    # DataLoader's worker) keeps what its parent set
    (tmp_path / "gcprobe.py").write_text(GC_PROBE)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["1", "1", "1"], res.stdout + res.stderr[-2000:]
    assert lines[1] == "invalid literal for int() with base 10: 'x'"
    assert lines[2] == "_exit ended without an answer in a process of perfsweep's job server (exit code 3)"
    assert lines[3] == "0"  # the sweep's own process: no torch
    enabled, frozen, grandchild = lines[4].split()
    assert (enabled, grandchild) == ("True", "False") and int(frozen) > 100_000, lines[4]


GC_PROBE = """
import gc, os


def state():
    return gc.isenabled(), gc.get_freeze_count()


def in_a_grandchild():
    gc.disable()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, b"1" if gc.isenabled() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    gc.enable()
    return os.read(r, 1) == b"1"
"""


def _on_a_machine(spare_core: bool, at_exit: str | None, *overrides: str) -> list[str]:
    """The command line of a sweep run as `perfsweep -m` would be, on a machine with a core
    spare or not (job_start.spare_core, whatever this machine's load), printing ``at_exit`` (what
    print() is given, evaluated in the sweep's process as it exits) as its last line on stderr."""
    import sys

    driver = (
        "import atexit, sys\n"
        "from perfsweep import job_start\n"
        f"job_start.spare_core = lambda: {spare_core}\n"
        + (f"atexit.register(lambda: print({at_exit}, file=sys.stderr))\n" if at_exit else "")
        + "sys.argv = ['perfsweep', *sys.argv[1:]]\n"
        "from perfsweep.__main__ import cli\n"
        "cli()\n"
    )
    return [sys.executable, "-c", driver, "-m", *overrides]


def _sweep_on_a_machine(tmp_path: Path, spare_core: bool, at_exit: str, *overrides: str) -> Any:
    """:func:`_on_a_machine`'s sweep, run to its end (PERFSWEEP_EARLY_JOB_SERVER unset)."""
    import subprocess

    env = {**os.environ, "PERFSWEEP_EARLY_JOB_SERVER": ""}
    argv = _on_a_machine(spare_core, at_exit, *overrides, *CPU)
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("when", ["early", "when-needed"])
def test_a_cpu_sweeps_own_process_never_imports_torch(when: str, tmp_path: Path):
    """A CPU sweep's process, from its command line to its summary, leaves torch to its job
    server and jobs: the matmul peak and the check of what ``ckpt=true`` wraps ran in processes
    forked from the server, and the job's result came back without torch's types. The server
    started as the grid was composed (a spare core), or when the sweep first needed torch (a busy
    machine, as this suite's)."""
    res = _sweep_on_a_machine(tmp_path, when == "early", "'torch in the sweep:', 'torch' in sys.modules", "ckpt=true")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "torch in the sweep: False" in res.stderr, res.stderr[-3000:]
    runs = sqlite_rows(tmp_path / "results.db", "SELECT status, start_method FROM runs")
    assert runs == [{"status": "ok", "start_method": "forkserver"}]
    (sweep,) = sqlite_rows(tmp_path / "results.db", "SELECT cpu_matmul_fp32_flops, cpu_matmul_threads FROM sweeps")
    assert sweep["cpu_matmul_fp32_flops"] > 0 and sweep["cpu_matmul_threads"] >= 1, sweep


def test_a_refused_user_model_is_answered_without_torch_in_the_sweeps_process(tmp_path: Path):
    """The check of a user's model runs in a process forked from the job server; its refusal
    (perfsweep.task's ContractError) came back pickled, and unpickling it imported perfsweep.task
    and torch in the sweep's process: seconds on a CUDA build, for a one-line refusal (a review
    found it with a stand-in CUDA build: 3.7 to 4.0 s). It comes back as a plain ConfigError."""
    import subprocess

    (tmp_path / "usermodels.py").write_text(textwrap.dedent(USER_MODEL))
    overrides = ["model=custom", "model._target_=usermodels.logits_only"]  # no model.loss: its forward must give one
    argv = _on_a_machine(True, "'torch in the sweep:', 'torch' in sys.modules", *overrides, "seed=0,1")
    argv += [o for o in CPU if not o.startswith("model=")]
    env = {**os.environ, "PERFSWEEP_EARLY_JOB_SERVER": ""}
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "the forward must return a scalar loss tensor" in lines[0], res.stderr[-3000:]
    assert lines[-1] == "torch in the sweep: False", res.stderr[-3000:]


def test_a_database_that_cannot_be_opened_is_refused_before_the_job_server_starts(tmp_path: Path):
    """On a busy machine the job server starts when the sweep first needs torch, for the CPU's
    matmul peak, which is timed once the database has opened: a damaged file is refused in its one
    line without 3 CPU-seconds of the server's imports."""
    (tmp_path / "results.db").write_bytes(b"not a database" * 100)
    res = _sweep_on_a_machine(tmp_path, False, "'server:', job_start._server_pid()")
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.startswith("perfsweep: cannot open db.url="), res.stderr[-3000:]
    assert res.stderr.splitlines()[-1] == "server: None", res.stderr[-3000:]


def test_ctrl_c_as_a_check_is_forked_from_the_job_server_stops_that_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Ctrl-C while the sweep starts the check of a user's model in a process forked from the job
    server (held while the start waits for the server's imports, a second or two on a busy
    machine) stops that process too. It went on with the check and printed a BrokenPipeError's
    traceback after the sweep's last line (found by sending Ctrl-C 1.8 to 3.5 s into sweeps)."""
    (tmp_path / "usermodels.py").write_text(SLOW.replace("time.sleep(0.7)", "time.sleep(3.0)"))
    monkeypatch.setenv("PERFSWEEP_EARLY_JOB_SERVER", "")
    user_model = ["model=custom", "model._target_=usermodels.slow", "model.loss=cross_entropy"]
    proc = start_as_in_a_terminal(
        _on_a_machine(False, None, *user_model, *[o for o in CPU if not o.startswith("model=")]),
        tmp_path,
    )
    try:
        job_server(proc.pid)  # started for the check: its imports take a second or two
        os.killpg(proc.pid, signal.SIGINT)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    out, err = finish(proc, 120)  # to the end of stderr: a check left running would hold it open
    time.sleep(0.5)  # the job server ends as the sweep does
    left = in_group(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "perfsweep: interrupted before any job started", err[-3000:]
    assert "Traceback" not in err and not left, (err[-3000:], left)


def test_a_refused_sweep_leaves_no_job_server_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A grid refused after its server was started early (a data file that is not there is found
    after the grid is composed) exits with its one line, and the server, still importing torch,
    goes with it: it held the output of the refused sweep for 2 s more, and used a core."""
    import sys

    monkeypatch.setenv("PERFSWEEP_EARLY_JOB_SERVER", "1")  # early whatever this machine's load
    proc = start_as_in_a_terminal(
        [sys.executable, "-m", "perfsweep", "-m", "data=textfile", f"data.path={tmp_path}/no/such/file.txt"]
        + ["seed=0,1", *[o for o in CPU if not o.startswith("data=")]],
        tmp_path,
    )
    proc.wait(timeout=120)  # the command's exit, not the end of its output: a server would hold that
    left = [cmd for cmd in in_group(proc.pid) if "multiprocessing.forkserver" in cmd]
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    out, err = finish(proc, 60)
    assert proc.returncode == 2 and "no job was started" in err, err[-2000:]
    assert not left, f"a job server outlived the refused sweep: {left}"
