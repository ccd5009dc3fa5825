"""The first code a job's process runs, spawned or forked from the job server: stdlib and
perfsweep.names only.

Its output goes to the job folder's ``job.log`` before anything else, so a Ctrl-C that lands
while the job starts (a spawned job's imports take a second or two) leaves its traceback there
instead of on the sweep's terminal. The job's arguments travel pickled as bytes for the same
reason: unpickling them imports perfsweep.data and torch (in a spawned job), which must come
after the redirect.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from pathlib import Path
from typing import Any

from perfsweep import interrupts
from perfsweep.names import JOB_PROCESS_NAME


def name_process(name: str) -> None:
    """What ``ps`` and ``top`` show for this process (Linux's ``/proc/self/comm``, 15 bytes at
    most); elsewhere it keeps its name."""
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(name[:15])


def redirect_output(job_dir: str) -> None:
    """This process's stdout and stderr (file descriptors 1 and 2, for C++ and child output too) to job.log."""
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(job_dir) / "job.log", "ab") as log_file:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)


def unwritable_folder(job_dir: str, exc: OSError) -> str:
    """What to tell the user when the job's folder cannot take its log."""
    return (
        f"the job's folder {job_dir} could not be written ({exc.strerror or exc}); "
        "free disk space or fix its permissions, then resume the sweep"
    )


def main(job_dir: str, conn: Any, payload: bytes, start_method: str = "spawn", package: str | None = None) -> None:
    """Run :func:`perfsweep.runner.job_main` with the arguments pickled in ``payload``;
    ``start_method`` says how this process was started (perfsweep.job_start.start_method), for its row.
    ``package``: where the sweep imported perfsweep from; a job that imported it elsewhere (a job
    server whose interpreter resolved another copy) fails saying so rather than run other code.

    A job folder that cannot be written (deleted under a read-only parent, a full disk) is this
    job's failure, reported through ``conn`` like any other: unreported, the sweep could only say
    that the process exited without a result.
    """
    name_process(JOB_PROCESS_NAME)
    try:
        redirect_output(job_dir)
    except OSError as exc:
        conn.send(("error", "failed", unwritable_folder(job_dir, exc), "", {}))
        conn.close()
        return
    mine = str(Path(sys.modules["perfsweep"].__file__ or "").resolve())
    if package is not None and mine != package:
        why = (
            f"this job imported perfsweep from {mine}, the sweep from {package} ({start_method}): "
            "run the sweep with the interpreter and sys.path its jobs get, or with launcher.start_method=spawn"
        )
        conn.send(("error", "failed", why, "", {"start_method": start_method}))
        conn.close()
        return
    # the sweep started this process with Ctrl-C, SIGTERM and SIGHUP blocked (perfsweep.job_start.
    # signals_blocked): one that came while the interpreter started is raised here, its traceback in job.log
    signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupts.HELD_SIGNALS)
    cfg_dict, token_data, label, launch_dir, cpus = pickle.loads(payload)  # imports torch (spawned)
    from perfsweep import runner

    runner.job_main(cfg_dict, token_data, job_dir, label, launch_dir, conn, cpus, start_method)
    if not cfg_dict.get("profile", {}).get("nvtx"):  # under nsys (profile.nvtx) the usual exit lets it collect
        exit_now()


def exit_now(code: int = 0, collect: bool = True) -> None:
    """End the process with ``code`` without the interpreter's finalization, once the job has
    reported (job_main never raises: every outcome has gone back through the pipe); the
    ``perfsweep`` command ends this way too, once it is done (perfsweep.__main__.cli).

    Finalizing a process that imported torch and ran the profiler took 0.6 s, and the sweep waits
    for a job to exit before it starts the next, so every job paid it. The exit handlers still
    run, as at a normal exit (20 ms): multiprocessing's among them unlinks the semaphores of the
    DataLoader's queues and stops its workers; skipped, the sweep's resource tracker warned of
    leaked semaphores. A collection (``collect``) first lets a DataLoader iterator caught in a
    reference cycle (a Ctrl-C's traceback holds one) shut its workers down itself; skipped where
    no worker was alive, a job stopped by Ctrl-C with ``workers=2`` (the signal reaches the
    workers too) left a leaked semaphore once in CI. In a job forked from the job server the
    collection walks only what the job made (perfsweep.job_server freezes what the server
    imported); a process that imported torch itself walks about 300,000 objects (0.13 s on the
    2-core VM), which the command skips where it has no child process (``collect=False``).
    """
    import atexit
    import gc
    import sys
    import threading

    if collect:
        gc.collect()
    # What a normal exit runs before finalizing, in its order: the wait for non-daemon threads and
    # the threading exit hooks (joblib's loky executor stops its workers there; without it, the
    # next step waited for them forever), then the exit handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing to keep
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):  # C and C++ output (oneDNN, MKL) buffered for job.log
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(code)
