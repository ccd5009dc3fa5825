"""One grid point, one fresh process: spawn the job, watch it, store whatever comes back.

The launching process prepares the token cache, spawns the job with the ``spawn`` start
method (it never touches CUDA itself), relays step progress to the terminal, enforces the
timeout, and writes the run row, ok or not, in one transaction. A job that raises, runs out
of memory, is killed or overruns its time is a result with a status, never a lost sweep.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import multiprocessing as mp
import os
import pickle
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from perfsweep import corpus, importer, interrupts, job_entry, job_start, slots, store
from perfsweep.cli import first_line, seconds_text
from perfsweep.config import PerfsweepConfig, short_dirname, to_plain_dict
from perfsweep.envinfo import environ_set, oom_kills, sigkill_outcome
from perfsweep.job_start import signals_blocked  # by name: a test holds a signal in a job's start alone
from perfsweep.metrics import JobClock
from perfsweep.names import (
    EXIT_0_STATUSES,
    GRID_AXES,
    HASHED_UNLESS_DEFAULT,
    HEARTBEAT_INTERVAL_S,
    NOT_MEASURED,
    interrupted_tail,
)
from perfsweep.slots import Placement, SlotPool
from perfsweep.store import utcnow

log = logging.getLogger(__name__)


@dataclass
class JobSpec:
    """What the launcher needs to know about one grid point beyond its config."""

    cfg: PerfsweepConfig
    job_dir: Path
    launch_dir: Path
    sweep_dir: str
    sweep_name: str
    overrides: list[str] = field(default_factory=list)
    job_num: int = 0
    command: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    """``hydra.job.env_set``: Hydra sets it only while its task function runs, and a job started
    later in a thread of its own (``launcher.parallel``) must still get it."""

    @property
    def multirun(self) -> bool:
        """Part of a multirun, which ``perfsweep resume`` finishes (only the sweeper sets ``sweep.id``)."""
        return self.cfg.sweep.id is not None

    @property
    def label(self) -> str:
        """File-name-safe name of the job from what it measures, e.g. ``amp=true,ckpt=false``: the
        overrides of where results go and how the sweep runs (NOT_MEASURED) are left out, as from
        the job's folder name: a db.url's password was in every trace's and profile's file name,
        and so in the ``artifacts`` table."""
        measured = [o for o in self.overrides if o.lstrip("+~").partition("=")[0].split(".")[0] not in NOT_MEASURED]
        text = ",".join(measured) or "default"
        return short_dirname("".join(c if c.isalnum() or c in "=,._-" else "_" for c in text))


def not_ok_line(statuses: list[str]) -> str:
    """'2 of 4 jobs did not finish ok (1 failed, 1 timeout)' for the exit message (skipped jobs are not counted)."""
    bad = [s for s in statuses if s not in EXIT_0_STATUSES]
    counts = ", ".join(f"{bad.count(s)} {s}" for s in dict.fromkeys(bad))
    return f"{len(bad)} of {len(statuses)} job{'s' if len(statuses) != 1 else ''} did not finish ok ({counts})"


def db_url(cfg: PerfsweepConfig, launch_dir: str | Path) -> str:
    return cfg.db.url or store.default_url(launch_dir)


def config_hash(config: dict[str, Any]) -> str:
    """Identity of what was measured: the config minus where results go and how they are labelled."""
    keep = {
        k: v
        for k, v in config.items()
        if k not in NOT_MEASURED and not (k in HASHED_UNLESS_DEFAULT and v == HASHED_UNLESS_DEFAULT[k])
    }
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


def stored_config(config: dict[str, Any]) -> dict[str, Any]:
    """``runs.config_json``: the config with its db.url's password as ``***``, as ``overrides`` and
    ``sweeps.command`` store it. Nothing connects from a stored config (resume takes its --db), and
    every reader of the results could read the password there."""
    url = config.get("db", {}).get("url")
    return {**config, "db": {**config["db"], "url": store.hide_password_in_word(url)}} if url else config


class ProgressLine:
    """Shows job k/n, its overrides, the step it is on and the time left, for people watching."""

    def __init__(self, spec: JobSpec, concurrent: bool = False) -> None:
        self.spec = spec
        self.concurrent = concurrent
        """Other jobs print too: whole lines named by job, no carriage-return updates, no sweep estimate."""
        self.tty = sys.stderr.isatty() and not concurrent
        searching = spec.cfg.sweep.batch_search_id is not None  # a try: the jobs so far, more may come
        self.open_ended = searching or spec.cfg.sweep.searches > 0
        """A batch=max search is running or to come: the jobs left are unknown, so no sweep estimate."""
        self.count = f"{spec.job_num + 1}/{spec.cfg.sweep.n_jobs}" + (" so far" if searching else "")
        self.tag = f"[{self.count}] " if concurrent else ""
        self.job_start = time.time()
        self.sweep_start = spec.cfg.sweep.started_at or self.job_start
        self.last_phase = ""

    def header(self) -> None:
        s = self.spec
        # Hydra escapes ':' in values (db.url=sqlite\:///); db.url's password is not for the terminal
        shown = " ".join(store.hide_password_in_word(re.sub(r"\\(.)", r"\1", o)) for o in s.overrides)
        print(f"[{self.count}] {shown or '(defaults)'}", file=sys.stderr, flush=True)

    def update(self, phase: str, step: int, total: int, ms: float, loss: float) -> None:
        job_left = (total - step) * ms / 1000.0
        done_jobs = self.spec.job_num
        now = time.time()
        if done_jobs > 0:
            per_job = (self.job_start - self.sweep_start) / done_jobs
        else:
            per_job = (now - self.job_start) + job_left
        sweep_left = job_left + per_job * (self.spec.cfg.sweep.n_jobs - done_jobs - 1)
        text = (
            f"  {self.tag}{phase:<7} step {step:>3}/{total} {ms:8.1f} ms  loss {loss:7.3f}  job ~{seconds_text(job_left)} left"
            + ("" if self.concurrent or self.open_ended else f", sweep ~{seconds_text(sweep_left)} left")
        )
        if self.tty:
            print("\r" + text, end="", file=sys.stderr, flush=True)
        elif phase != self.last_phase or step == total:
            print(text, file=sys.stderr, flush=True)
        self.last_phase = phase

    def done(self, status: str, tokens_per_s: float | None, samples_per_s: float | None = None) -> None:
        if self.tty:
            print(file=sys.stderr)
        tps = (
            f", {tokens_per_s:,.0f} tokens/s"
            if tokens_per_s
            else f", {samples_per_s:,.0f} samples/s"
            if samples_per_s
            else ""
        )
        print(f"  {self.tag}-> {status}{tps} in {time.time() - self.job_start:.1f} s", file=sys.stderr, flush=True)


class Heartbeat:
    """Stamps the running row every names.HEARTBEAT_INTERVAL_S; a failed stamp is only logged.

    The stamp is written from a thread of its own and the call returns at once. Written inline,
    a database locked by another process held the loop that reads the job's progress for up to
    the driver's busy timeout (30 s); the job's pipe filled, the job blocked between its timed
    steps, and that wait was stored in its tokens/s (a third of the true figure, seen in a fault
    injection). A stamp still in flight when the next is due is not doubled."""

    def __init__(self, engine: Any, run_id: int | None) -> None:
        self.engine, self.run_id = engine, run_id
        self.last = time.monotonic()
        self._writing: threading.Thread | None = None

    def __call__(self) -> None:
        if self.run_id is None or time.monotonic() - self.last < HEARTBEAT_INTERVAL_S:
            return
        self.last = time.monotonic()
        if self._writing is not None and self._writing.is_alive():
            return
        self._writing = threading.Thread(target=self._stamp, name="perfsweep-run-heartbeat", daemon=True)
        self._writing.start()

    def _stamp(self) -> None:
        try:
            store.heartbeat(self.engine, self.run_id)
        except Exception as exc:  # noqa: BLE001 - a busy database must not stop the job
            log.debug("heartbeat not written: %s", exc)


class SweepHeartbeat:
    """While the sweep runs, a thread stamps its row every names.HEARTBEAT_INTERVAL_S (the jobs
    stamp their own rows), so a sweep whose jobs wait in a cluster queue is not taken for dead
    by another host."""

    def __init__(self, url: str, sweep_id: int) -> None:
        self.url, self.sweep_id = url, sweep_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perfsweep-sweep-heartbeat", daemon=True)

    def _run(self) -> None:
        engine = store.make_engine(self.url)
        try:
            while not self._stop.wait(HEARTBEAT_INTERVAL_S):
                try:
                    store.sweep_heartbeat(engine, self.sweep_id)
                except Exception as exc:  # noqa: BLE001 - a busy database must not stop the sweep
                    log.debug("sweep heartbeat not written: %s", exc)
        finally:
            engine.dispose()

    def __enter__(self) -> SweepHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _run_in_child(
    spec: JobSpec,
    config: dict[str, Any],
    token_data: corpus.TokenData | None,
    progress: ProgressLine,
    beat: Callable[[], None],
    clock: JobClock,
    placement: Placement | None = None,
    cancel: threading.Event | None = None,
) -> tuple[str, str | None, dict[str, Any], datetime]:
    """Run the job (``config`` is its plain-dict config) in a spawned process, in ``placement``'s
    slot when jobs run concurrently; ``cancel`` set (Ctrl-C in the sweep) stops it as interrupted;
    ``clock`` gets the job's milestones: its start, its ready, its steps and window, its outcome.

    Returns (status, error, result fields, when the outcome was known). The timeout clock starts
    when the job reports ``ready`` (interpreter started, torch imported), so a slow start-up is
    not charged to the job; start-up itself gets ``timeout_s`` of its own.
    """
    job_start.apply_env_defaults()
    parent_conn, child_conn = mp.Pipe(duplex=False)
    cpus = list(placement.cpus) if placement is not None and placement.cpus else None
    payload = pickle.dumps((config, token_data, spec.label, str(spec.launch_dir), cpus))  # see perfsweep.job_entry
    kills_before = oom_kills()  # the kernel's OOM kills so far: did a SIGKILL come from it?
    log_from = _log_size(spec.job_dir)  # job.log is appended to: a resumed try reads only its own lines
    started: list[Any] = []
    outcome: tuple[str, str | None, dict[str, Any]] | None = None
    try:
        try:
            env = {**spec.env, **(placement.env() if placement is not None else {})}
            clock.launched = time.monotonic()
            _start_job(spec, child_conn, payload, env, started, cancel)
        finally:
            child_conn.close()  # the job holds the only sending end: its death closes the pipe
        proc = started[0]
        deadline = time.monotonic() + spec.cfg.timeout_s
        while outcome is None:
            beat()
            if cancel is not None and cancel.is_set():
                raise JobCancelled.now()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome = (
                    "timeout",
                    f"job exceeded timeout_s={spec.cfg.timeout_s:g} and was killed; raise timeout_s or lower steps",
                    {},
                )
                break
            if parent_conn.poll(min(remaining, 0.5)):
                try:
                    msg = parent_conn.recv()
                except EOFError:  # child died without reporting
                    break
                clock.heard(msg)
                if msg[0] == "ready":
                    deadline = time.monotonic() + spec.cfg.timeout_s
                elif msg[0] == "progress":
                    progress.update(*msg[1:])
                elif msg[0] != "milestone":
                    outcome = _outcome_of(msg)
                    clock.ended = time.monotonic()
            elif not _running(proc) and not parent_conn.poll():
                break
    except BaseException as exc:  # Ctrl-C, SIGTERM or a cancel: the job is stopped and stored as it ended
        if not started:  # it never started: nothing to stop
            parent_conn.close()
            raise
        ended = _wait_for_exit(parent_conn, started[0], outcome and (*outcome, utcnow()), stopped=True, clock=clock)[0]
        if ended is not None:  # it reported: a result that crossed the Ctrl-C is kept (perfsweep_outcome)
            exc.perfsweep_outcome = ended
        raise
    decided = utcnow()  # a timeout's stored duration ends at the deadline, not after the kill
    ended, signalled = _wait_for_exit(parent_conn, proc, outcome and (*outcome, decided), stopped=False, clock=clock)
    if ended is not None:
        return ended
    code = proc.exitcode  # the job died without a word
    # Ctrl-C reaches the sweep and its jobs at once; a job may die of it (exit code 1 or -SIGINT,
    # while starting) before the sweep, unwinding, sets cancel: a short wait tells the two apart
    if cancel is not None and cancel.wait(timeout=CANCEL_GRACE_S):
        raise JobCancelled.now()
    if code in (-signal.SIGINT, -signal.SIGHUP) and not signalled:  # Ctrl-C, a closed terminal, before it reported
        outcome = ("interrupted", f"interrupted ({signal.Signals(-code).name})", {})
    elif signalled:
        outcome = ("failed", "job process stopped reporting without a result and was stopped by perfsweep", {})
    elif code == -signal.SIGKILL:
        outcome = sigkill_outcome("job process", kills_before, oom_kills())
    elif code is not None and code < 0:
        outcome = ("failed", f"job process {killed_by(code)}", {})
    elif (limit := spec.cfg.job_memory_limit_mib) is not None and _no_thread_for_openmp(spec.job_dir, log_from):
        outcome = (
            "oom",
            f"job process exited with code {code}: OpenMP could not create a thread under job_memory_limit_mib="
            f"{limit} (libgomp: {OPENMP_NO_THREAD}): the address space ran out; raise the limit or lower batch",
            {},
        )
    else:
        outcome = ("failed", f"job process exited with code {code} without reporting a result", {})
    return (*outcome, decided)


OPENMP_NO_THREAD = "Thread creation failed: Resource temporarily unavailable"
"""What GNU OpenMP prints, before it exits the process with code 1, where a thread cannot get its
stack: under ``job_memory_limit_mib`` (an address-space limit) that is the memory running out
outside torch's allocator (the tiny GPT at a 10 MiB limit), and it was stored ``failed``."""


def _log_size(job_dir: Path) -> int:
    try:
        return (job_dir / "job.log").stat().st_size
    except OSError:
        return 0


def _no_thread_for_openmp(job_dir: Path, since: int = 0) -> bool:
    """Whether libgomp's :data:`OPENMP_NO_THREAD` is among the last 4 KiB the job wrote to its
    log after byte ``since`` (where this try began: an earlier try's line is not this one's)."""
    try:
        with open(job_dir / "job.log", "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(since, end - 4096))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return False
    return f"libgomp: {OPENMP_NO_THREAD}" in tail


class Stopped(BaseException):
    """A scheduler ended the job: raised in the launching process by :func:`scheduler_signals`."""


SCHEDULER_SIGNALS = {
    signal.SIGTERM: "scancel, the time limit or preemption",
    signal.SIGUSR2: "submitit's warning that the time limit is near, or preemption",
}


@contextlib.contextmanager
def scheduler_signals() -> Iterator[None]:
    """Under submitit (``hydra/launcher=submitit_slurm`` or ``submitit_local``), a SIGTERM or
    SIGUSR2 to the job is its scheduler ending it: the run is stored ``interrupted`` saying so, and
    the job returns that status to the sweep. (submitit's own handlers would ignore SIGTERM, so
    the run was stored as a job ``killed by SIGTERM``, and requeue on SIGUSR2, rerunning the grid
    point from scratch.) Elsewhere, and off the main thread, signals keep their meaning."""
    if os.environ.get("SUBMITIT_EXECUTOR") is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        raise Stopped(f"stopped by {name} from the scheduler ({SCHEDULER_SIGNALS[signal.Signals(signum)]})")

    with interrupts.handled(SCHEDULER_SIGNALS, stop):
        yield


CANCEL_GRACE_S = 2.0
"""How long a concurrent job that died without reporting waits for the sweep's cancel before it
is stored ``failed``: what a hard crash pays so that Ctrl-C is never taken for one."""


class JobCancelled(BaseException):
    """Raised in a concurrent job's thread when the sweep is interrupted: handled like Ctrl-C."""

    @classmethod
    def now(cls) -> JobCancelled:
        """Saying which signal stopped the sweep (only its main thread receives them)."""
        first = interrupts.first_signal()
        return cls(f"the sweep was stopped by {first}" if first else "the sweep was stopped")


_SPAWN_LOCK = threading.RLock()
"""Concurrent jobs start one at a time: a child takes the environment of the moment it starts."""

SPAWN_START_METHODS = ("spawn", "fork", "forkserver")
"""multiprocessing's own start methods; a spawned child re-applies its parent's, and fails on any
other (joblib's loky workers report ``loky``)."""


def _start_job(
    spec: JobSpec,
    child_conn: Any,
    payload: bytes,
    job_env: dict[str, str],
    started: list[Any],
    cancel: threading.Event | None = None,
) -> None:
    """Start the job's process (:func:`start_method`), its signals blocked (:func:`signals_blocked`),
    and put it in ``started`` as soon as it runs (the only way out: see below). A Ctrl-C or SIGTERM meanwhile is held
    (interrupts.held: the mask alone holds nothing once another thread of this process, the
    heartbeat's or OpenMP's, can take the signal) and raised out of this call: the caller then
    finds the job in ``started`` and stops it. (It lost the job, which trained on unwatched: after
    a SIGTERM to the sweep alone until the sweep was gone.)

    The job server, unless the sweep started it early (perfsweep.job_start.start_early), is
    started with the first forked job, its Ctrl-C and SIGTERM blocked as a spawned job's are
    (and so those of every job forked from it); the start waits for its imports to end before
    the block, where a Ctrl-C stops the sweep before the job starts (``cancel``: a concurrent
    job's, set as the sweep stops: its thread takes no signal). A server that fails (it died, it
    cannot be reached) costs that job nothing: it is spawned instead, and so is every later job of
    this process. The choice and the start hold _SPAWN_LOCK, so a job thread's start never sees
    another's environment (:func:`_spawning`)."""
    name = f"perfsweep-job-{spec.job_num}"
    package = str(Path(sys.modules["perfsweep"].__file__ or "").resolve())  # a job must run the same code

    def args(how: str) -> tuple:
        return (str(spec.job_dir), child_conn, payload, how, package)

    with _SPAWN_LOCK:
        if job_start.start_method(spec.cfg, job_env, slots.wants_cuda(spec.cfg.device)) == "forkserver":
            proc = job_start.forkserver_context().Process(target=job_entry.main, args=args("forkserver"), name=name)
            try:
                job_start.server_ready(cancel)  # a Ctrl-C while the server imports stops the sweep at once
                if cancel is not None and cancel.is_set():  # a concurrent job's: the sweep stopped meanwhile
                    raise JobCancelled.now()
                with interrupts.held(), _spawning({}), signals_blocked():
                    proc.start()
                    started.append(proc)
                    job_start.job_forked()
                return
            except (OSError, EOFError) as exc:
                job_start.server_failed()
                log.warning("could not fork the job from perfsweep's job server (%s); spawning it instead", exc)
        proc = mp.get_context("spawn").Process(target=job_entry.main, args=args("spawn"), name=name)
        with interrupts.held(), _spawning(job_env), signals_blocked():
            proc.start()
            started.append(proc)


@contextlib.contextmanager
def _spawning(env: dict[str, str]) -> Iterator[None]:
    """Start a job process with ``env`` added to this process's environment, from any thread and
    under any Hydra launcher: a launcher whose workers carry a foreign start method (joblib's loky)
    gets "spawn" as its default, which the job's process re-applies (forked or spawned) and
    multiprocessing knows."""
    with _SPAWN_LOCK:
        if mp.get_start_method(allow_none=True) not in (*SPAWN_START_METHODS, None):
            mp.set_start_method("spawn", force=True)
        with environ_set(env):
            yield


def job_free_bytes(cfg: PerfsweepConfig) -> tuple[str | None, int | None]:
    """(device type, memory free to a job) as a fresh job process of ``cfg`` sees it (its memory
    limit applied, its CUDA context open), for batch=max's prediction; (None, None) on failure.

    A plain process and a pipe, not a Pool: a Pool replaces a worker that dies (OOM-killed,
    ``kill -9``) and drops its task, so the search waited ``timeout_s`` in silence for an answer
    that could not come."""
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    with _spawning({}):
        proc = ctx.Process(target=_report_free_bytes, args=(to_plain_dict(cfg), send), daemon=True)
        proc.start()
    send.close()  # the child holds the only sending end: its death closes the pipe
    why = None
    try:
        if receive.poll(cfg.timeout_s):
            kind, value = receive.recv()
            if kind == "ok":
                return value
            why = value
        else:
            why = f"no answer in timeout_s={cfg.timeout_s:g} s"
    except EOFError:
        proc.join(5.0)
        code = proc.exitcode
        why = f"its process was {killed_by(code)}" if code is not None and code < 0 else f"exit code {code}"
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        proc.join(5.0)
    log.warning("could not read the memory free to a job (%s); the batch search starts at 1", why)
    return None, None


def killed_by(exit_code: int) -> str:
    """'killed by SIGTERM' for a process's negative exit code; a real-time signal has no name."""
    try:
        return f"killed by {signal.Signals(-exit_code).name}"
    except ValueError:
        return f"killed by signal {-exit_code}"


def _report_free_bytes(cfg_dict: dict[str, Any], conn: Any) -> None:
    try:
        from perfsweep import runner

        conn.send(("ok", runner.job_free_bytes(cfg_dict)))
    except KeyboardInterrupt:  # the sweep got the same Ctrl-C and is stopping: no traceback here
        pass
    except Exception as exc:  # noqa: BLE001 - told to the sweep, which starts at batch 1
        conn.send(("error", first_line(exc)))
    finally:
        conn.close()


UNWIND_REPORT_S = 2.0
"""After Ctrl-C, how long a job has to say it caught the signal (its ``interrupted`` report)
before perfsweep signals it itself."""

STOP_GRACE_S = {"reported": 10.0, "ended": 2.0, "silent": 0.0}
"""How long a job may take to exit by itself, by what it did (:func:`_last_word`): one that
reported is unwinding, one whose pipe closed is going, a silent one has had its moment already."""


Outcome = tuple[str, str | None, dict[str, Any], datetime]
"""(status, error, result fields, when it was known): a job's end as run_job stores it."""


def _wait_for_exit(
    conn: Any, proc: Any, ended: Outcome | None, stopped: bool, clock: JobClock
) -> tuple[Outcome | None, bool]:
    """Let the job process exit and return (its outcome if it reported one, whether perfsweep had
    to signal it). ``ended``: the outcome already received, if any (a job that reported is
    shutting down by itself: DataLoader workers, CUDA; a timed-out one is not). Otherwise the job
    has a moment for its last word: after Ctrl-C it got the same SIGINT and is unwinding, and a
    second SIGINT now would cut its DataLoader's shutdown short. ``stopped`` (the sweep is being
    stopped): only a result is taken from that last word, since Ctrl-C also reaches the job's
    DataLoader workers, whose death then reads as the job's own error.

    Ctrl-C and SIGTERM are held meanwhile; one that came is raised afterwards carrying the outcome
    as ``perfsweep_outcome``, so a finished job is stored as finished whatever the signals.
    ``clock`` gets the time a last word taken here arrived."""
    signalled = False
    try:
        with interrupts.held(interrupts.STOPPING_NOTE):
            if ended is None:
                heard, last = _last_word(conn, proc, UNWIND_REPORT_S, clock)
                if last is not None and (not stopped or last[0] == "result"):
                    ended = (*_outcome_of(last), utcnow())
                    clock.ended = time.monotonic()
                signalled = _stop(proc, grace_s=STOP_GRACE_S[heard])
            else:
                signalled = _stop(proc, grace_s=0 if ended[0] == "timeout" else STOP_GRACE_S["reported"])
    except BaseException as late:  # a signal held while the job stopped
        if ended is not None:
            late.perfsweep_outcome = ended
        raise
    finally:
        conn.close()
    return ended, signalled


def _last_word(conn: Any, proc: Any, seconds: float, clock: JobClock) -> tuple[str, tuple | None]:
    """What the job does within ``seconds``, and its report if it made one: ``reported`` its end
    (an error, or a result that crossed the Ctrl-C: a finished job is stored as finished; progress
    lines do not count, a job still training sends them), ``ended`` (its pipe closed or the process
    is gone, without a word), or stayed ``silent``. Milestones read on the way go to ``clock``: a
    result that crossed the Ctrl-C has its window's end among them."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            if conn.poll(min(left, 0.1)):
                msg = conn.recv()
                if msg[0] in ("error", "result"):
                    return "reported", msg
                clock.heard(msg)
        except Exception:  # noqa: BLE001 - EOF, or a message cut in half by the Ctrl-C: no report
            return "ended", None
        if not _running(proc):
            return "ended", None
    return "silent", None


def _outcome_of(msg: tuple) -> tuple[str, str | None, dict[str, Any]]:
    """(status, error, fields) of a job's ``result`` or ``error`` report."""
    if msg[0] == "result":
        return "ok", None, msg[1]
    _, status, message, tb, partial = msg
    log.debug("job traceback:\n%s", tb)
    return status, f"{message}\n{tb}" if tb else message, partial


def _stop(proc: Any, grace_s: float) -> bool:
    """Wait up to ``grace_s`` for the process to exit; then SIGINT, SIGTERM, SIGKILL in turn.
    True if it had to be signalled (so a death by SIGINT was perfsweep's doing, not Ctrl-C's).

    SIGINT first: the job unwinds as from Ctrl-C, so its DataLoader shuts its workers down and
    their semaphores are released; a plain SIGTERM left them behind and Python's resource
    tracker warned about "leaked semaphore objects" at exit. Not where this process ignores
    SIGINT (started in a script's background): its jobs ignore it too (interrupts.held), and
    each stop waited 5 s for nothing.
    """
    _join(proc, grace_s)
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    for i, sig in enumerate((signal.SIGTERM,) if ignored else (signal.SIGINT, signal.SIGTERM)):
        if not _running(proc):
            return i > 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        _join(proc, 5)
    if _running(proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        _join(proc, None)
    return True


def _running(proc: Any) -> bool:
    """Whether the job's process is still there. A forked job is the job server's child, and the
    server reports its exit; were the server gone (killed: it ignores SIGUSR2 and holds Ctrl-C
    and SIGTERM, so only SIGKILL or the like), every job forked from it would read as exited with
    code 255 while it trained on. Its own pid is asked then."""
    if proc.is_alive():
        return True
    return (
        getattr(proc, "_start_method", None) == "forkserver"
        and proc.exitcode == 255
        and job_start.pid_running(proc.pid)
    )


def _join(proc: Any, timeout: float | None) -> None:
    """``proc.join(timeout)``, which returns at once for a forked job whose server is gone:
    then the job's pid is watched for the same time."""
    proc.join(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while _running(proc) and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.05)


def sweep_fields(spec: JobSpec) -> dict[str, Any]:
    """What the sweep's row records besides its folder and name (also kept in result.json)."""
    return {
        "command": spec.command,
        "n_jobs": spec.cfg.sweep.n_jobs,
        "hostname": socket.gethostname(),
        "launch_dir": str(Path(spec.launch_dir).resolve()),
    }


def run_job(
    spec: JobSpec, placement: Placement | None = None, cancel: threading.Event | None = None
) -> tuple[int | None, str]:
    """Run one grid point and store it; returns (run id, status). Never raises for a job failure.

    The row is written ``running`` before the job starts and completed at the end, so a sweep
    killed midway leaves rows the next command marks ``interrupted``. Ctrl-C (or ``cancel``, for a
    concurrent job) marks it at once; so does SIGTERM, which SLURM sends on ``scancel`` and at
    the time limit.
    """
    cfg = spec.cfg
    url = db_url(cfg, spec.launch_dir)
    try:
        engine = store.connect(url)
    except Exception as exc:  # noqa: BLE001 - the database went away mid-sweep: the job still runs
        log.warning(
            "cannot open %s (%s); the job runs and keeps its result in its folder",
            store.hide_password(url),
            first_line(exc),
        )
        engine = store.make_engine(url)  # connects only when used: every write fails over to result.json
    fields_of_sweep = sweep_fields(spec)
    sweep_id = cfg.sweep.id  # reserved by the sweeper; a single run finds or creates its row
    if sweep_id is None:
        sweep_id = store.get_or_create_sweep(engine, spec.sweep_dir, spec.sweep_name, **fields_of_sweep)
    progress = ProgressLine(spec, concurrent=placement is not None and placement.cpus is not None)
    progress.header()
    started = utcnow()
    spec.job_dir.mkdir(parents=True, exist_ok=True)
    config = to_plain_dict(cfg)
    row: dict[str, Any] = {k: config[k] for k in GRID_AXES}
    row.update(
        sweep_id=sweep_id,
        job_num=spec.job_num,
        overrides=" ".join(map(store.hide_password_in_word, spec.overrides)),
        amp_dtype=config["amp_dtype"],
        model_name=cfg.model.model_name[:100],  # the columns' length: a long _target_ path is cut, not refused
        data_name=cfg.data.data_name[:100],
        config_json=stored_config(config),
        config_hash=config_hash(config),
        started_at=started,
        job_dir=str(spec.job_dir.resolve()),
        hostname=socket.gethostname(),
        pid=os.getpid(),
        run_uid=uuid.uuid4().hex,
        repeat_index=cfg.sweep.repeat_index,  # on the row from the start: a failed repeat says which it was
        grid_index=cfg.sweep.grid_index,
        batch_search_id=cfg.sweep.batch_search_id,
        nproc=cfg.nproc,
        global_batch=cfg.batch * (cfg.nproc or 1),
        slurm_job_id=slots.slurm_job_id(),
        # where the job may run, known before it starts (its own process records it again)
        cuda_visible_devices=placement.env().get("CUDA_VISIBLE_DEVICES", "")[:255] or None if placement else None,
        **slots.cpu_share(placement.cpus if placement is not None else None),
    )
    run_id = _begin(engine, row)
    clock = JobClock()
    try:
        with scheduler_signals():
            try:
                token_data = corpus.prepare(cfg.data, cfg.seed) if cfg.data._target_ is None else None
            except Exception as exc:  # noqa: BLE001 - a data problem is this job's result
                status, error, fields, finished = (
                    "failed",
                    f"preparing data failed: {type(exc).__name__}: {exc}",
                    {},
                    utcnow(),
                )
            else:
                status, error, fields, finished = _run_in_child(
                    spec, config, token_data, progress, Heartbeat(engine, run_id), clock, placement, cancel
                )
    except BaseException as exc:  # Ctrl-C, a scheduler's signal or a cancelled sweep: the job was stopped
        ended = getattr(exc, "perfsweep_outcome", None)  # it had reported (a result that crossed the Ctrl-C)
        row.update(clock.phases().row())  # how far it got: its start, its setup, its window
        if ended is not None:
            with interrupts.held():
                _finish(engine, row, run_id, spec, fields_of_sweep, progress, started, *ended)
            status = ended[0]
        else:
            status = "interrupted"
            why = (
                str(exc)
                if isinstance(exc, Stopped)
                else f"interrupted ({exc if isinstance(exc, JobCancelled) else interrupts.signal_name(exc)})"
            )
            if run_id is not None:
                try:
                    with interrupts.held():
                        store.save_run(
                            engine,
                            {
                                **row,
                                "status": status,
                                "finished_at": utcnow(),
                                "error": f"{why} {interrupted_tail(spec.multirun)}",
                            },
                            run_id,
                        )
                except Exception as write_exc:  # noqa: BLE001 - the next command marks it from its pid
                    log.warning("could not mark the run interrupted: %s", first_line(write_exc))
            if isinstance(exc, Stopped):
                print(f"  {progress.tag}interrupted: {why}", file=sys.stderr, flush=True)
        engine.dispose()
        if isinstance(exc, Stopped):  # this job's own end: its sweep goes on and counts it
            return run_id, status
        raise
    row.update(clock.phases().row())
    with interrupts.held():  # a Ctrl-C now waits for the result to be stored
        saved_id = _finish(
            engine, row, run_id, spec, fields_of_sweep, progress, started, status, error, fields, finished
        )
    engine.dispose()
    return saved_id, status


def _finish(
    engine: Any,
    row: dict[str, Any],
    run_id: int | None,
    spec: JobSpec,
    fields_of_sweep: dict[str, Any],
    progress: ProgressLine,
    started: datetime,
    status: str,
    error: str | None,
    fields: dict[str, Any],
    finished: datetime,
) -> int | None:
    """Store the job's outcome and print it; returns the run's id (None: kept as result.json).
    An ``interrupted`` job's error gets its last words here: how to rerun it (JobSpec.multirun)."""
    if status == "interrupted" and error:
        error = f"{error} {interrupted_tail(spec.multirun)}"
    row.update(status=status, error=error, finished_at=finished, duration_s=(finished - started).total_seconds())
    row.update(fields)
    saved_id = _save(engine, row, run_id, spec, fields_of_sweep)
    progress.done(status, row.get("tokens_per_s"), row.get("samples_per_s"))
    if error:
        print(f"  {progress.tag}{status}: {first_line(error)}", file=sys.stderr, flush=True)
    return saved_id


class ConcurrentJobs:
    """A multirun's jobs with ``launcher.parallel`` > 1, under Hydra's basic launcher.

    Hydra's launcher still calls perfsweep once per job, in order; each call takes a free slot
    (waiting until one is free), starts :func:`run_job` in a thread of its own and returns its
    Future at once. The sweeper collects the statuses with :meth:`wait`. Every job is still its
    own spawned process with its own row, heartbeat and timeout.
    """

    def __init__(self, placements: list[Placement]) -> None:
        self.pool = SlotPool(placements)
        self.cancel = threading.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(self.pool.size, thread_name_prefix="perfsweep-job")
        self._futures: list[concurrent.futures.Future] = []

    def submit(self, spec: JobSpec) -> concurrent.futures.Future:
        self._raise_if_output_closed()
        placement = self.pool.acquire()

        def job() -> str:
            try:
                return run_job(spec, placement, self.cancel)[1]
            finally:
                self.pool.release(placement)

        future = self._executor.submit(job)
        self._futures.append(future)
        return future

    def wait(self) -> None:
        """Until every submitted job has ended (timed waits: Ctrl-C reaches the main thread)."""
        while not all(f.done() for f in self._futures):
            concurrent.futures.wait(self._futures, timeout=0.5)
            self._raise_if_output_closed()
        self._raise_if_output_closed()

    def _raise_if_output_closed(self) -> None:
        """A job's thread that could not print (a closed pipe or terminal) stops the sweep here, in
        the main thread, as :func:`run_until_output_closed` does for a job run in it."""
        for f in self._futures:
            if f.done() and not f.cancelled() and interrupts.output_gone(error := f.exception()):
                raise interrupts.output_closed(error) from error

    def stop(self) -> None:
        """Interrupt the jobs still running (each marks its row ``interrupted``) and wait for them."""
        interrupts.release_logging_locks()  # called by the main thread, outside any logging call
        self.cancel.set()
        self._executor.shutdown(wait=True, cancel_futures=True)


_concurrent: ConcurrentJobs | None = None


def start_concurrent(placements: list[Placement]) -> ConcurrentJobs:
    """Make the sweeper's :class:`ConcurrentJobs` the one the jobs of this process submit to."""
    global _concurrent
    _concurrent = ConcurrentJobs(placements)
    return _concurrent


def wait_concurrent() -> None:
    if _concurrent is not None:
        _concurrent.wait()


def end_concurrent() -> None:
    global _concurrent
    if _concurrent is not None:
        _concurrent.stop()
        _concurrent = None


def launch(spec: JobSpec) -> Any:
    """A multirun job's return value for Hydra: its status, or with ``launcher.parallel`` > 1 a
    Future of it (the sweeper resolves it)."""
    interrupts.raise_if_lost()  # a Ctrl-C swallowed while the last job ended: no new job
    if _concurrent is not None:
        return _concurrent.submit(spec)
    return run_until_output_closed(spec)[1]


def run_until_output_closed(spec: JobSpec) -> tuple[int | None, str]:
    """:func:`run_job`, with a write to a closed pipe or terminal (the job is then stopped and
    stored ``interrupted``) raised as :class:`perfsweep.interrupts.OutputClosed`: a Ctrl-C to the
    sweep, not an error of this job that Hydra would catch before starting the next."""
    try:
        return run_job(spec)
    except OSError as exc:
        if not interrupts.output_gone(exc):
            raise
        raise interrupts.output_closed(exc) from exc


def _begin(engine: Any, row: dict[str, Any]) -> int | None:
    """The job's ``running`` row; if the database refuses, the job still runs (result kept on disk)."""
    try:
        return store.begin_run(engine, row)
    except Exception as exc:  # noqa: BLE001
        log.warning(
            "could not write the running row (%s); the job runs and its result is kept on disk",
            store.why_refused(engine, row.get("sweep_id"), exc),
        )
        return None


def _save(
    engine: Any, row: dict[str, Any], run_id: int | None, spec: JobSpec, fields_of_sweep: dict[str, Any]
) -> int | None:
    """Store the run; if the database refuses (or its file was deleted or replaced while the job
    ran), keep the whole result as result.json for `perfsweep import`: in the job's folder, or
    where a file can still be written when that folder is gone or its disk full."""
    try:
        if why := store.file_replaced(engine):
            raise OSError(why)
        return store.save_run(engine, row, run_id=run_id)
    except Exception as exc:
        log.debug("database write failed", exc_info=True)  # the whole driver message, for --verbose
        sweep = {"sweep_dir": spec.sweep_dir, "name": spec.sweep_name, **fields_of_sweep}
        kept, failures = None, []
        for folder in _result_folders(spec):
            try:
                folder.mkdir(parents=True, exist_ok=True)
                importer.write_result_file(folder / importer.RESULT_FILE, sweep, row)
            except OSError as write_exc:
                failures.append(f"{folder}: {write_exc.strerror or write_exc}")
                continue
            kept = folder / importer.RESULT_FILE
            break
        why = store.why_refused(engine, row.get("sweep_id"), exc)
        if kept is not None:
            print(f"  database write failed ({why}); result kept in {kept}", file=sys.stderr)
        else:
            print(
                f"  database write failed ({why}) and the result could not be kept on disk either "
                f"({'; '.join(failures)}): this run's figures are lost; rerun it",
                file=sys.stderr,
            )
        return None


def _result_folders(spec: JobSpec) -> list[Path]:
    """Where a result the database refused is kept, in order: the job's folder, then (that folder
    deleted, or its disk full) the sweep's importer.spare_folder; the sweep's last line names both."""
    return [spec.job_dir, importer.spare_folder(spec.sweep_dir) / spec.job_dir.name]
