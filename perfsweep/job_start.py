"""How a job's process starts: forked from the sweep's job server, or spawned; what a start holds.

The job server is multiprocessing's forkserver: it imports torch once for the sweep
(:data:`FORKSERVER_PRELOAD`; the server's own side is perfsweep.job_server) and forks CPU jobs
from itself. Its imports take about 2 s on a 2-core CPU. Started with the first job, every sweep
waited that long before its first job; :func:`start_early` starts it as soon as a sweep's grid
is composed, where a core is spare, so its imports run while the sweep imports its own and
checks the grid (docs/benchmarks.md). What the sweep itself needs torch for before its jobs (the
CPU's matmul peak, a check of a user's model) is forked from the server too (:func:`call`), so
the sweep's own process never imports torch where its jobs are forked. Torch-free for that reason.

perfsweep.launcher decides each job's start (:func:`start_method`) and starts it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, TypeVar

from perfsweep import interrupts, job_entry, slots
from perfsweep.config import ConfigError, Device, PerfsweepConfig, StartMethod
from perfsweep.names import CHECK_PROCESS_NAME, EARLY_JOB_SERVER_ENV, JOB_SERVER_READY_ENV

log = logging.getLogger(__name__)

T = TypeVar("T")

FORKSERVER_PRELOAD = (
    "perfsweep.job_server",
    "torch",
    "torch._dynamo",
    "perfsweep.runner",
    "perfsweep.job_server_ready",
)
"""What the job server imports once for the sweep: its own side first (perfsweep.job_server: a
quick exit, and no garbage collection during the rest), then torch, its Dynamo (torch.optim
imports it with the first optimizer: 1.2 s of a tiny CPU job's 2.5 s on a 2-core Xeon) and
perfsweep's runner; last, perfsweep.job_server_ready, which says they are done
(:func:`wait_until_ready`)."""


JOB_ENV_DEFAULTS = {"KINETO_LOG_LEVEL": "5"}
"""Set in the sweep's process before any job starts (a job inherits them): the profiler's C++
start and stop lines stay off the terminal."""

_server_env: dict[str, str] | None = None
"""The environment the job server started with; None until it has."""
_server_failed = False
"""The server could not start a job once: every later job is spawned."""
_will_fork = False
"""Some job of the sweep will be forked from the server (:func:`start_early`): what the sweep
needs torch for before its jobs is done in processes forked from it too (:func:`call`)."""
_stop_registered = False
"""Whether :func:`_stop_unused` runs at exit."""
_forked = 0
"""Jobs forked from the server: one started early and never used is stopped at exit."""
_ready_file: str | None = None
"""The file the server creates once its imports are done (perfsweep.job_server_ready); None
until a server is started (:func:`_choose_ready_file`), or where no folder could be had."""
_announcing: int | None = None
"""The pid of the server :func:`_start_server` started knowing :data:`_ready_file`: only that
one creates it."""
_ready_pid: int | None = None
"""The pid of the server :func:`wait_until_ready` last saw ready: no later request waits for it."""


def start_method(cfg: PerfsweepConfig, job_env: dict[str, str], cuda: bool) -> str:
    """``spawn`` or ``forkserver`` for one job (``launcher.start_method``; ``cuda``: the job runs on
    CUDA); call under perfsweep.launcher's spawn lock.

    A forked job inherits what its server read on importing torch: OpenMP's and MKL's thread
    counts, TORCH_LOGS, Inductor's settings. So a job is forked only where it has the server's
    environment: not one given variables of its own (``hydra.job.env_set``, which Hydra also
    sets and unsets in this process while it hands out jobs; a slot's CUDA_VISIBLE_DEVICES), nor
    one of a process whose environment changed since the server started. Those are spawned."""
    wanted = cfg.launcher.start_method
    if _server_failed or wanted == StartMethod.spawn:
        return "spawn"
    if wanted == StartMethod.auto and cuda:
        return "spawn"
    if job_env or (_server_env is not None and not _same_env(_server_env, dict(os.environ))):
        log.debug("job spawned, not forked: its environment is not the job server's")
        return "spawn"
    return "forkserver"


SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)
"""Variables torch sets itself, to its default, when a process first imports Dynamo: the server
does on its imports, the sweep when it imports Dynamo later (checking a user's model with its
optimizer). Where the server started without one, the sweep's later value is that same default,
not a change: a job forked from the server has it too."""


def _same_env(server: dict[str, str], now: dict[str, str]) -> bool:
    """``now`` is ``server``, but for a variable of SET_BY_TORCH whose value is what torch sets it
    to from the server's (a user's relative TORCHINDUCTOR_CACHE_DIR made absolute, or torch's
    default where there was none): so a value set to anything else still makes a difference."""
    return all(
        server.get(k) == now.get(k) or (k in SET_BY_TORCH and now.get(k) == _set_by_torch(k, server))
        for k in set(server) | set(now)
    )


def _set_by_torch(key: str, server: dict[str, str]) -> str | None:
    """The value torch gives ``key`` on importing Dynamo in a process started with ``server``'s
    environment. Only torch's own module sets it, so where this process has not imported that
    module, only an unchanged value is the same (and this module imports no torch)."""
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if utils is None:
        return server.get(key)
    return os.path.abspath(server.get(key) or utils.default_cache_dir())


def apply_env_defaults() -> None:
    """:data:`JOB_ENV_DEFAULTS`, where the user set nothing else."""
    for key, value in JOB_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Ctrl-C and SIGTERM blocked in this thread, and so in a process it starts, until the job
    unblocks them (:func:`perfsweep.job_entry.main`), its output then going to its job.log.

    Ctrl-C reaches the sweep's jobs with it (one process group); one that came while a job's
    interpreter was still starting printed "Fatal Python error: init_import_site ...
    KeyboardInterrupt" and its traceback on the user's terminal. Blocked, it waits, and the job
    takes it as its first instruction. This process may still take it meanwhile, through another
    of its threads: hold it there with interrupts.held.
    multiprocessing's resource tracker is started first: starting it, in the first job's start,
    unblocks both signals in this thread whatever was blocked before. It starts with SIGHUP
    blocked, for good: it ignores Ctrl-C and SIGTERM itself, but a closed terminal's SIGHUP killed
    it, and the tracker the jobs then started again knew none of their semaphores (a KeyError's
    traceback in job.log for each one they released).
    """
    from multiprocessing import resource_tracker

    hangup = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, hangup)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def forkserver_context() -> Any:
    """multiprocessing's forkserver context, its server to import :data:`FORKSERVER_PRELOAD`."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


def server_started() -> None:
    """Record the environment the server starts with (call as it starts, with the first job)."""
    global _server_env
    if _server_env is None:
        _server_env = dict(os.environ)


def job_forked() -> None:
    """A job was forked from the server: it is in use, and ends with the sweep by itself."""
    global _forked
    _forked += 1


def server_failed() -> None:
    """The server could not start a job: this one and every later one are spawned."""
    global _server_failed
    _server_failed = True


def may_use_cuda(device: Device) -> bool:
    """Whether a job asking for ``device`` may run on CUDA, without importing torch: an NVIDIA
    (or ROCm, or WSL) GPU device file, and CUDA_VISIBLE_DEVICES not set empty. A wrong yes only
    leaves the job server to start with the first job, as before; the job's start asks torch."""
    if device != Device.auto:
        return device == Device.cuda
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg"))


def spare_core() -> bool:
    """Whether a core is idle for the server's imports: this process may use two or more (its
    affinity mask, no more than its cgroup's CPU quota: the sweep itself keeps one busy), and the
    load average over the last minute is at least one under that. On a busy machine (2 cores
    running 2 test workers) the imports only took the core from other work, the sweep's own checks
    among them: a set of the suite's tests took 10% longer so, one refused sweep 0.7 s more CPU.
    (The load average is the host's, also in a container: a busy host reads as busy.)"""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average: not known to be spare
        return False
    cores = len(slots.allowed_cpus())
    return cores >= 2 and load + 1 <= cores


def start_early(cfgs: list[PerfsweepConfig], job_env: dict[str, str]) -> bool:
    """Plan the job server: if any of ``cfgs`` would be forked (:func:`start_method`, with the
    jobs' ``hydra.job.env_set`` as ``job_env``, CUDA guessed by :func:`may_use_cuda`), what the
    sweep needs torch for before its jobs is done in processes forked from it (:func:`call`), and
    it starts now where a core is spare (:func:`spare_core`); True if it was started. Call before
    any job starts, where jobs start in this process (perfsweep's own launcher, not submitit's nor
    joblib's). EARLY_JOB_SERVER_ENV decides instead of the load: 1 starts it now; 0 leaves it to
    the first job, and the sweep then imports torch itself for its checks, as before there was a
    server (what a benchmark of the first job's start compares against).

    The server starts with Ctrl-C and SIGTERM blocked, as with a job (:func:`signals_blocked`).
    One no job was forked from (the sweep refused, every job spawned) is stopped at exit: still
    importing, it held the output of a refused sweep for 2 s after its one line."""
    global _will_fork
    if _server_env is not None or not any(
        start_method(c, job_env, may_use_cuda(c.device)) == "forkserver" for c in cfgs
    ):
        return False
    wanted = os.environ.get(EARLY_JOB_SERVER_ENV, "")
    if wanted == "0" or _server_pid() is not None:  # a forkserver of this process's own (a notebook's, a test's)
        return False
    _will_fork = True
    if wanted != "1" and not spare_core():
        return False
    try:
        _start_server()
    except OSError as exc:
        log.debug("could not start the job server early (%s); it starts when the sweep needs it", exc)
        return False
    return True


def _start_server() -> None:
    """Start the job server (as a job's start would), its Ctrl-C and SIGTERM blocked; where it
    runs already, nothing. A server started here says when its imports are done
    (:func:`wait_until_ready`)."""
    global _stop_registered, _announcing
    apply_env_defaults()
    if not _stop_registered:
        atexit.register(_stop_unused)  # first: a Ctrl-C held in the start comes as it ends
        _stop_registered = True
    if _server_env is None:
        _choose_ready_file()
    pid = _server_pid()
    fresh = pid is None or not _server_alive(pid)
    if fresh and _ready_file is not None:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(_ready_file), exist_ok=True)
            os.unlink(_ready_file)  # a server that died said so; the one that replaces it says it anew
    forkserver_context()
    with interrupts.held(), signals_blocked():
        forkserver.ensure_running()
        server_started()
    if fresh and _ready_file is not None:
        _announcing = _server_pid()


def _choose_ready_file() -> None:
    """:data:`_ready_file`, in the folder of multiprocessing's own that holds the server's socket
    (removed as this process exits), named in the environment before the first server starts:
    the server reads it there, and a job is forked only where the environment is the server's
    (:func:`start_method`), so it is chosen once and never changed while a server runs."""
    global _ready_file
    from multiprocessing import util

    try:
        _ready_file = os.path.join(util.get_temp_dir(), "job-server", "ready")
        os.environ[JOB_SERVER_READY_ENV] = _ready_file
    except OSError as exc:  # no temporary folder: the server's socket cannot be made either
        log.debug("no folder for the job server's ready file (%s)", exc)
        _ready_file = None
        os.environ.pop(JOB_SERVER_READY_ENV, None)


def server_ready(cancel: threading.Event | None = None) -> None:
    """The job server started where it is not running, and its imports done, before a request
    for a process (a job, a check) is made with Ctrl-C and SIGTERM blocked: the server answers a
    request only once its imports are done, and a Ctrl-C pressed meanwhile waited for them.
    Raises OSError where the server cannot be started or ends before it is ready; the caller
    then spawns, or runs its check itself, as where the request fails. ``cancel``: as
    :func:`wait_until_ready`'s."""
    _start_server()
    wait_until_ready(cancel)


def wait_until_ready(cancel: threading.Event | None = None) -> None:
    """Until the job server this process started has created :data:`_ready_file` (its imports are
    done; once per server), with Ctrl-C and SIGTERM free to stop the sweep meanwhile. Returns at
    once for a server that was not started so (another's: a notebook's own forkserver), and where
    the server could not create the file (it removes the folder: the request is then made as it
    was before there was a wait); returns once ``cancel`` is set (a job thread's: the sweep is
    stopping, and only its main thread takes signals). Raises OSError where the server ends
    first: restarted inside the request, its imports would hold a Ctrl-C again."""
    global _ready_pid
    pid = _server_pid()
    if pid is None or pid != _announcing or pid == _ready_pid or _ready_file is None:
        return
    while not os.path.exists(_ready_file):
        if not os.path.isdir(os.path.dirname(_ready_file)):
            break
        if not _server_alive(pid):
            raise OSError(f"perfsweep's job server (pid {pid}) ended while it imported torch")
        if cancel is not None and cancel.is_set():
            return
        time.sleep(0.02)
    _ready_pid = pid


def _server_alive(pid: int) -> bool:
    """Whether this process's child ``pid`` (the server) has not exited, without collecting its
    exit: multiprocessing collects it as it replaces the server. (Python before 3.13 has no
    waitid on macOS: there, without /proc, a server that exited reads as alive until collected.)"""
    if hasattr(os, "waitid"):
        with contextlib.suppress(ChildProcessError):  # not this process's child, or collected already
            return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    if os.path.isdir("/proc"):
        return pid_running(pid)
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def call(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a process forked from the job server where the sweep's jobs will be forked
    from it (:func:`start_early`; the server is started here if it has not been), else in this
    process. What the sweep needs torch for before its jobs start (the CPU's matmul peak, a check
    of a user's model) is done so: the server imports torch once for the sweep, and importing it in
    the sweep's process too cost 1 to 2 CPU-seconds of every sweep on a 2-core CPU
    (docs/benchmarks.md). ``fn`` and ``args`` must pickle (``fn`` by its module's name), as a job's
    do. What ``fn`` raises is raised here; a process that dies without answering raises
    RuntimeError; a server that cannot fork leaves ``fn`` to run here, and every job to be spawned."""
    if not _will_fork or _server_failed:
        return fn(*args)
    ctx = forkserver_context()
    answer, send = ctx.Pipe(duplex=False)
    name = getattr(fn, "__name__", "call")
    proc = ctx.Process(target=_answer, args=(send, fn, args, os.getpid()), name=f"perfsweep-{name}")
    try:
        try:
            server_ready()
            with interrupts.held(), signals_blocked():
                proc.start()
        finally:
            send.close()  # the child holds the only sending end: its death closes the pipe
    except (OSError, EOFError) as exc:
        server_failed()
        log.warning("could not fork from perfsweep's job server (%s); its jobs are spawned", exc)
        answer.close()
        return fn(*args)
    except BaseException:  # a Ctrl-C or SIGTERM held during the start, raised as it ended
        _stop(proc)
        answer.close()
        raise
    try:
        kind, value = answer.recv()
    except EOFError:
        proc.join()
        raise CallDied(name, proc.exitcode) from None
    except BaseException:  # Ctrl-C, SIGTERM: the child cannot take them (blocked, as a job's start)
        _stop(proc)
        raise
    finally:
        answer.close()
    proc.join()
    if kind == "error":
        raise value
    return value


def _stop(proc: Any) -> None:
    """Kill a process of :func:`call` that was started (its answer is no longer wanted: the sweep is
    stopping) and collect it; it went on, and wrote a BrokenPipeError's traceback on the terminal
    after the sweep's last line."""
    if proc.pid is not None:
        proc.kill()
        proc.join()


class CallDied(RuntimeError):
    """A process of :func:`call` ended without an answer (a crash in the code it ran, an exit)."""

    def __init__(self, name: str, exitcode: int | None) -> None:
        super().__init__(
            f"{name} ended without an answer in a process of perfsweep's job server (exit code {exitcode})"
        )
        self.exitcode = exitcode


def _answer(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...], sweep_pid: int | None = None) -> None:
    """:func:`call`'s side in the forked process: ("ok", result) or ("error", exception). A
    ConfigError of a subclass (perfsweep.task's ContractError) goes as a plain ConfigError with its
    text: unpickling the subclass would import its module, and torch with it, in the sweep's
    process, seconds on a CUDA build for a refusal. Any other exception that would not travel
    (one whose class cannot be rebuilt from its args, one holding something unpicklable) goes as
    a RuntimeError with its class and text. It ends by itself once the sweep
    (``sweep_pid``) is gone: a sweep killed outright left it running to the end of a user's slow
    model check, and its server and resource tracker with it."""
    import pickle

    job_entry.name_process(CHECK_PROCESS_NAME)
    if sweep_pid is not None:
        threading.Thread(target=_end_with, args=(sweep_pid,), daemon=True).start()
    try:
        result: tuple[str, Any] = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - the caller raises it
        if isinstance(exc, ConfigError):
            result = ("error", ConfigError(str(exc)))
        else:
            result = ("error", exc)
            try:
                pickle.loads(pickle.dumps(exc))
            except Exception:  # noqa: BLE001
                result = ("error", RuntimeError(f"{type(exc).__name__}: {exc}"))
    with contextlib.suppress(OSError):  # the sweep is gone (killed): nobody to answer, nothing to say
        conn.send(result)
        conn.close()


def _end_with(pid: int) -> None:
    """Exit this process once ``pid`` is gone (polled every 0.2 s)."""
    while pid_running(pid):
        time.sleep(0.2)
    os._exit(1)


def _server_pid() -> int | None:
    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def _stop_unused() -> None:
    """At exit: a server started before any job that no job was forked from is killed."""
    pid = _server_pid()
    if not _forked and pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def pid_running(pid: int) -> bool:
    """A process with ``pid`` exists and is not a zombie (its exit not yet collected)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # gone (without /proc: taken as gone, as multiprocessing said)
        return False
