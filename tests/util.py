"""Helpers shared by the tests: the tiny job settings and a way to run the CLI as a user does."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

# Small enough that a job takes a few seconds on 2 cores, real enough to exercise every path.
TINY = [
    "model=tiny",
    "data=synthetic",
    "batch=4",
    "seq_len=32",
    "steps.warmup=1",
    "steps.stable_window=0",  # exactly one warmup step: tests/test_timing.py and the default sweep check the rule
    "steps.measure=3",
    "profile.wait=0",
    "profile.warmup=0",
    "profile.active=1",
    "report=false",  # the summary only: the report is tested from report_sweeps (tests/conftest_report.py)
]


FAILING_MODEL = """
from torch import nn


class Fails(nn.Module):
    def __init__(self, vocab_size, fail_at):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab_size, 16), nn.Linear(16, vocab_size)
        self.fail_at, self.calls = fail_at, 0

    def forward(self, idx, targets):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"the model broke on its forward number {self.calls}")
        return nn.functional.cross_entropy(self.head(self.emb(idx)).flatten(0, 1), targets.flatten())


def build(vocab_size, seq_len, fail_at=0):
    return Fails(vocab_size, fail_at)
"""


def failing_model(folder: Path) -> list[str]:
    """:data:`TINY` with a model of the user's that raises on its forward number ``+model.fail_at``
    (0: never; the check before the jobs runs one forward, so 2 passes it and fails in the job):
    a job that fails inside, after every check, for the tests of failed jobs. Written to ``folder``,
    the launch directory its factory is imported from. On the CPU: a failure is handled alike on
    either device, and on a GPU machine CUDA jobs are spawned, each importing torch's CUDA build
    (tests 5 to 8 times slower than on the 2-core VM on an H200 machine, 2026-11-28)."""
    (folder / "failmodel.py").write_text(FAILING_MODEL)
    tiny = (o for o in TINY if not o.startswith("model="))
    return ["model=custom", "model._target_=failmodel.build", "device=cpu", *tiny]


def run_perfsweep(
    args: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the CLI exactly as a user would, in ``cwd`` (where results.db lands)."""
    return subprocess.run(
        [sys.executable, "-m", "perfsweep", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def start_perfsweep(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """:func:`run_perfsweep` without waiting: the sweep runs while the test breaks something."""
    return subprocess.Popen(
        [sys.executable, "-m", "perfsweep", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """``proc.communicate(timeout)``; a sweep still running then fails the test with every
    thread's stack (perfsweep.names.STACKS_ENV, which tests/conftest.py sets), so a hang that
    shows once in CI says where it waited. It is killed afterwards, with its jobs where it has a
    process group of its own (:func:`start_as_in_a_terminal`). Its stderr is read from the file
    :func:`start_as_in_a_terminal` wrote it to, where it was given one."""
    import signal

    def said(err: str) -> str:
        return err if proc.stderr is not None else Path(proc.args_stderr_file).read_text()  # type: ignore[attr-defined]

    try:
        out, err = proc.communicate(timeout=timeout)
        return out, said(err)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(proc.pid) == proc.pid:  # its own group (start_as_in_a_terminal): its jobs too
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired as still:  # a process outside its group holds the pipes
            err = still.stderr.decode(errors="replace") if isinstance(still.stderr, bytes) else still.stderr or ""
        pytest.fail(f"still running after {timeout:g} s; its stderr, with its threads' stacks:\n{said(err)[-8000:]}")


def start_as_in_a_terminal(argv: list[str], cwd: Path, stderr_file: Path | None = None) -> subprocess.Popen:
    """Start a command as a terminal would (its own process group, Ctrl-C not ignored), with its
    output piped: ``os.killpg(proc.pid, SIGINT)`` is then a Ctrl-C to it and its jobs. With
    ``stderr_file``, its stderr goes there instead, for a test to wait for a line in it
    (:func:`training`); :func:`finish` returns it all the same."""
    import signal

    with open(stderr_file, "w") if stderr_file else contextlib.nullcontext(subprocess.PIPE) as err:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    proc.args_stderr_file = stderr_file  # type: ignore[attr-defined]
    return proc


def stopped_while_the_database_is_waited_for(args: list[str], cwd: Path, notice: str) -> None:
    """Start ``perfsweep ARGS`` in ``cwd`` while a test holds its database locked, wait for the line
    that starts with ``notice`` (the "still waiting for the database" one), press Ctrl-C, and check
    that the sweep stops at once (SQLite and libpq waited in C, deaf to it), as a stop before any
    job (130)."""
    import signal

    proc = start_as_in_a_terminal([sys.executable, "-m", "perfsweep", *args], cwd)
    said = next((line for line in iter(proc.stderr.readline, "") if line.startswith(notice)), "")
    assert said.rstrip().endswith("(Ctrl-C stops it)") and proc.poll() is None, said
    os.killpg(proc.pid, signal.SIGINT)
    asked = time.monotonic()
    _, err = finish(proc, 60)
    assert time.monotonic() - asked < 10 and proc.returncode == 130, err[-2000:]
    assert err.splitlines()[-1] == "perfsweep: interrupted before any job started", err[-2000:]


def training(stderr_file: Path, *parallel_jobs: str, serial_job: str | None = None) -> bool:
    """Whether a job has printed a measured step in ``stderr_file``: each of ``parallel_jobs`` (a
    parallel sweep prefixes its jobs' lines with ``[1/4]``), or ``serial_job`` (a serial sweep
    starts each job's lines with a ``[2/2] ...`` header), or else a plain run's one job."""
    text = stderr_file.read_text() if stderr_file.exists() else ""
    if serial_job is not None:
        header = text.find(f"\n{serial_job} ")
        return header >= 0 and "measure step" in text[header:]
    return all(f"{job} measure step" in text for job in parallel_jobs) if parallel_jobs else "measure step" in text


def sqlite_rows(db: Path, sql: str) -> list[dict]:
    """Rows of ``sql`` on the SQLite file ``db`` as dicts, through the sqlite3 module, not perfsweep."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql)]
    finally:
        con.close()


def wait_for(predicate: Any, timeout: float = 120.0) -> None:
    """Poll ``predicate`` (a look at a sweep's SQLite file, typically) until it holds; a database
    whose schema is not created yet reads as not yet. Fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except sqlite3.OperationalError:  # the file or its schema is not created yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"condition not reached in {timeout:g} s")


def new_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """For a fixture parametrised with "sqlite"/"postgres": a SQLite file in ``tmp_path`` or a new
    database on the session's test PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    from tests.pg import new_database  # imported here so pytest_plugins loads tests.pg first

    return new_database(request.getfixturevalue("pg_url"))


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make ``path`` unwritable for this user: chmod, or for root (whom chmod does not stop) the
    immutable attribute; skip where neither works."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("running as root and chattr +i is not permitted here: cannot make a file read-only for root")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def run_row(sweep_id: int, **kw: Any) -> dict[str, Any]:
    """The smallest finished ``runs`` row the store accepts; ``kw`` adds or overrides columns."""
    return {
        "sweep_id": sweep_id,
        "amp": False,
        "ckpt": False,
        "batch": 4,
        "seq_len": 64,
        "compile": False,
        "workers": 0,
        "amp_dtype": "bf16",
        "model_name": "tiny",
        "data_name": "d",
        "config_json": {},
        "config_hash": "h",
        "status": "ok",
        "tokens_per_s": 1000.0,
        **kw,
    }


def job_process(sweep_pid: int, within_s: float = 60.0) -> int:
    """The pid of the sweep's one job process once it is there: a child of the sweep started by
    multiprocessing's spawn, or a child of the sweep's job server (a forked job; the first one
    waits for the server to import torch)."""
    return _one_of(sweep_pid, False, within_s)


def job_server(sweep_pid: int, within_s: float = 60.0) -> int:
    """The pid of the sweep's job server (multiprocessing's forkserver) once it is there."""
    return _one_of(sweep_pid, True, within_s)


def _one_of(sweep_pid: int, server: bool, within_s: float) -> int:
    deadline = time.monotonic() + within_s
    while not (found := [pid for pid, is_server in job_tree(sweep_pid) if is_server == server]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    what = "job servers" if server else "job processes"
    assert len(found) == 1, f"{len(found)} {what} under {sweep_pid}: {found}"
    return found[0]


def processes() -> dict[int, tuple[int, int, str, bytes]]:
    """Every process as pid -> (parent pid, process group, state: ``Z`` a zombie, command line)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the name, which may hold spaces
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
            found[int(stat.parent.name)] = (int(fields[1]), int(fields[2]), fields[0], cmdline)
        except (OSError, IndexError, ValueError):
            continue
    return found


def in_group(pgid: int) -> list[str]:
    """The command lines of the live processes (zombies left out) in process group ``pgid``."""
    return [
        cmd.decode(errors="replace")[:200]
        for _, group, state, cmd in processes().values()
        if group == pgid and state not in ("Z", "X")
    ]


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def job_tree(sweep_pid: int) -> list[tuple[int, bool]]:
    """The sweep's job processes and job servers, as (pid, is a server). A spawned job runs
    multiprocessing's spawn_main; the server's command line names multiprocessing.forkserver, and
    a job forked from it is its child (and keeps that command line) once it has named itself (its
    first step: perfsweep.job_entry); the resource tracker is neither, nor is a check the sweep
    forks from the server (perfsweep.job_start.call, named otherwise)."""
    from perfsweep.names import JOB_PROCESS_NAME

    procs = processes()
    children = {pid: cmd for pid, (ppid, _, _, cmd) in procs.items() if ppid == sweep_pid}
    servers = {pid for pid, cmd in children.items() if b"multiprocessing.forkserver" in cmd}
    jobs = [pid for pid, cmd in children.items() if b"spawn_main" in cmd and b"resource_tracker" not in cmd]
    forked = [pid for pid, (ppid, *_) in procs.items() if ppid in servers and _comm(pid) == JOB_PROCESS_NAME]
    return [(pid, False) for pid in jobs + forked] + [(pid, True) for pid in servers]


# A real SQLite database that stores the runs but refuses to close the sweep (its end and closing
# figures), as a disk filling up or a permission revoked after the last job would.
REFUSE_CLOSE = """
CREATE TRIGGER refuse_close BEFORE UPDATE OF status ON sweeps WHEN NEW.status = 'done'
BEGIN SELECT RAISE(ABORT, 'disk I/O error (test trigger)'); END;
"""


def sqlite_script(db: Path, script: str) -> None:
    """Runs SQL on a SQLite file outside perfsweep, as a user or a failing disk would."""
    con = sqlite3.connect(db)
    con.executescript(script)
    con.close()


def tiny_job(tmp_path: Path, job_num: int = 0, **settings):
    """A job of a few hundred milliseconds, stored in tmp_path/results.db unless ``settings`` say."""
    from perfsweep import launcher
    from perfsweep.config import DataConfig, DataKind, DbConfig, ModelConfig, PerfsweepConfig, ProfileConfig

    cfg = PerfsweepConfig(
        **{
            "model": ModelConfig(name="tiny", args=dict(n_layers=1, n_heads=2, d_model=32, d_ff=64, max_seq_len=64)),
            "data": DataConfig(name="syn", kind=DataKind.synthetic, synthetic_vocab=64, synthetic_tokens=5000),
            "batch": 2,
            "seq_len": 16,
            "device": "cpu",
            "profile": ProfileConfig(enabled=False),
            "db": DbConfig(url=f"sqlite:///{tmp_path / 'results.db'}"),
            **settings,
        }
    )
    return launcher.JobSpec(cfg, tmp_path / "job", tmp_path, str(tmp_path), "s", ["batch=2"], job_num=job_num)


class NoCgroup(Exception):
    """No cgroup with a CPU quota can be made, or joined, here; the message says why."""


@contextlib.contextmanager
def cpu_limited_group(cpus: float, prefix: str = "perfsweep-test") -> Iterator[Path]:
    """A new cgroup limited to ``cpus`` CPUs (v1's cpu tree, else v2's), removed afterwards;
    yields its folder. NoCgroup where none can be made or joined (not root, a read-only cgroupfs,
    no cpu controller, v2's rules or a delegation that stops at this process's own group)."""
    import uuid

    from perfsweep import cgroups

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    if (cgroups.ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        group = cgroups.ROOT / "cpu" / name
        files = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(int(cpus * 100000))}
    elif "cpu" in (cgroups._read(cgroups.ROOT / "cgroup.subtree_control") or "").split():
        group = cgroups.ROOT / name
        files = {"cpu.max": f"{int(cpus * 100000)} 100000"}
    else:
        raise NoCgroup("no cgroup cpu controller this process can use (neither v1's cpu tree nor v2's)")
    try:
        group.mkdir()
    except OSError as exc:
        raise NoCgroup(f"cannot make a cgroup here ({exc.strerror}): needs root and a writable cgroupfs") from None
    try:
        for file, value in files.items():
            (group / file).write_text(value)
        moved = subprocess.run(["sh", "-c", f'echo $$ > "{group / "cgroup.procs"}"'], capture_output=True, text=True)
        if moved.returncode != 0:
            raise NoCgroup(f"cannot move a process into a new cgroup here: {moved.stderr.strip()}")
        yield group
    finally:
        _remove_group(group)


def _remove_group(group: Path, within_s: float = 30.0) -> None:
    """rmdir ``group`` once its last process has left: multiprocessing's resource tracker outlives
    the sweep by a moment, and an rmdir then fails (EBUSY), which left a group behind."""
    deadline = time.monotonic() + within_s
    while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    group.rmdir()


def perfsweep_in_group(
    group: Path, args: list[str], cwd: Path, env: dict[str, str], timeout: float | None = None
) -> subprocess.CompletedProcess:
    """``python -m perfsweep ARGS`` run inside cgroup ``group``, from its first instruction."""
    script = f'echo $$ > "{group / "cgroup.procs"}" && exec "{sys.executable}" -m perfsweep "$@"'
    return subprocess.run(
        ["sh", "-c", script, "sh", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
