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

Imported first of the server's imports, it turns the cyclic garbage collector off for them
and freezes what they made (``gc.freeze``) as the server forks, turning it back on in the
child: Python's own recipe for a process that forks without exec. Off, the imports of torch and
Dynamo took 0.4 CPU-seconds less (1.8 in place of 2.2 on the 2-core VM), which every sweep
pays once. A job forked from the server inherits some 490,000 objects it will never free (some
180,000 of them garbage the imports left, about 7 MB shared by every job), and its
collections, the one at its exit included (perfsweep.job_entry.exit_now), walk only what the job
itself made (0.4 ms in place of 0.13 s); nor do they touch, and so copy, the server's pages.

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


SERVER_PID = os.getpid()
"""The server's process: what it forks (a job, a check) runs the at-fork hooks below too, and so
does what those fork in turn (a DataLoader's workers), where they must do nothing."""


def _freeze() -> None:
    if os.getpid() == SERVER_PID:
        gc.freeze()  # what the server made so far, its imports first, out of every later collection


def _in_child() -> None:
    if os.getppid() == SERVER_PID:  # a job or check the server forked: it collects as any process
        atexit.unregister(_exit_now)
        gc.enable()


atexit.register(_exit_now)
os.register_at_fork(before=_freeze, after_in_child=_in_child)
signal.signal(signal.SIGUSR2, signal.SIG_IGN)

gc.disable()  # for the imports after this module's, the first (job_start.FORKSERVER_PRELOAD)
