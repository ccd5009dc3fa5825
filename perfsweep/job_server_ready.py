"""Imported last by the job server (perfsweep.job_start.FORKSERVER_PRELOAD): its imports are done.

It creates the file :data:`perfsweep.names.JOB_SERVER_READY_ENV` names, or, where it cannot,
removes the file's folder. The sweep waits for either before it asks the server for a process
(perfsweep.job_start.wait_until_ready), with Ctrl-C and SIGTERM free to stop it: the request
itself is made with both blocked, and the server answers it only once its imports are done, so
a Ctrl-C pressed while it still imported torch waited for those imports to end (up to 1.3 s on
a 2-core VM; docs/benchmarks.md). multiprocessing goes on past a preload that fails to import,
so the file comes after a failed import too.
"""

from __future__ import annotations

import contextlib
import os

from perfsweep.names import JOB_SERVER_READY_ENV

if path := os.environ.get(JOB_SERVER_READY_ENV):
    try:
        open(path, "x").close()
    except FileExistsError:
        pass
    except OSError:  # no file to be had (no inode left, the folder gone): the folder gone says so
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))
