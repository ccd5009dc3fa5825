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

The sweep forks its own work that needs torch from the server too (the CPU's matmul peak, a
check of a user's model: perfsweep.job_start.call), so that its own process never imports torch.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal


def _exit_now() -> None:
    os._exit(0)


atexit.register(_exit_now)
os.register_at_fork(after_in_child=lambda: atexit.unregister(_exit_now))
signal.signal(signal.SIGUSR2, signal.SIG_IGN)

gc.freeze()  # after every import of the server's: this module is its last (job_start.FORKSERVER_PRELOAD)
