"""Imported last by the job server (perfsweep.job_start.FORKSERVER_PRELOAD): its imports are done.

It creates the file :data:`perfsweep.names.JOB_SERVER_READY_ENV` names. The sweep waits for that
file before it asks the server for a process (perfsweep.job_start.wait_until_ready), with Ctrl-C
and SIGTERM free to stop it, because the request itself is made with both blocked, and the
server answers it only once its imports are done: a Ctrl-C pressed while it still imported torch
waited for those imports to end (about a second on a 2-core VM, longer for a CUDA build of torch
on a cold disk). multiprocessing goes on past a preload that fails to import, so the file comes
after a failed import too.
"""

from __future__ import annotations

import contextlib
import os

from perfsweep.names import JOB_SERVER_READY_ENV

if path := os.environ.get(JOB_SERVER_READY_ENV):
    with contextlib.suppress(OSError):  # the sweep then waits its longest, and asks as before
        open(path, "x").close()
