"""Imported by the job server alone (perfsweep.job_start.FORKSERVER_PRELOAD), never by a job.

The server is multiprocessing's forkserver: it imports torch once for the sweep and forks every
CPU job from itself. It ends when the sweep and its jobs have (its "alive" pipe closes), and an
ordinary exit then finalizes the torch it imported: 0.6 s, during which it still holds the
sweep's stdout and stderr, so anything reading them to the end (``perfsweep ... | tee``,
``subprocess.run``) waited that long after the sweep had exited. The server exits at once
instead: it has nothing to flush or clean up. A job forked from it drops that exit, so its own
exit runs as usual (perfsweep.job_entry.exit_now).

It ignores SIGUSR2, which SLURM sends every process of a job step as submitit's warning that
the time limit is near: by default that signal ends a process, and a server gone leaves the
sweep unable to tell how the jobs forked from it exit (multiprocessing then reports exit code
255 for a job still running). Ctrl-C and SIGTERM reach it blocked
(perfsweep.job_start.signals_blocked); it ends with the sweep.

Imported last of the server's imports, it freezes what they made (``gc.freeze``): a job forked
from the server inherits some 300,000 objects it will never free, and its collections, the one
at its exit included (perfsweep.job_entry.exit_now), then walk only what the job itself made
(0.4 ms in place of 0.13 s on the 2-core VM); nor do they touch, and so copy, the server's pages.

It creates the file named by PERFSWEEP_JOB_SERVER_READY
(perfsweep.names.JOB_SERVER_READY_ENV) when the sweep started the server early: the sweep waits
for it before it times the CPU's matmul peak. The variable goes with it, not to the jobs.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
from pathlib import Path

from perfsweep.names import JOB_SERVER_READY_ENV


def _exit_now() -> None:
    os._exit(0)


atexit.register(_exit_now)
os.register_at_fork(after_in_child=lambda: atexit.unregister(_exit_now))
signal.signal(signal.SIGUSR2, signal.SIG_IGN)

gc.freeze()  # after every import of the server's: this module is its last (job_start.FORKSERVER_PRELOAD)

if _ready := os.environ.pop(JOB_SERVER_READY_ENV, None):
    with contextlib.suppress(OSError):  # an error here would end the server: the sweep's wait times out instead
        Path(_ready).touch()
