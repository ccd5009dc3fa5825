"""A sweep whose output goes away: the pipe it prints to closed (``perfsweep -m ... | head``),
or its terminal hung up (SIGHUP: a closed terminal, a dropped SSH session). Each is stopped and
stored as Ctrl-C is, and nothing is left ``running``; kept apart from tests/test_interrupts.py so
that the suite's two workers share these sweeps (``--dist loadfile``)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from perfsweep import interrupts


def test_a_sweep_whose_output_pipe_closes_stops_as_interrupted_and_resumes(tmp_path):
    """``perfsweep -m ... 2>&1 | head``: once the reader is gone every print fails (EPIPE). That
    failed each later job on its first line, with no row, and the sweep was stored ``done`` with
    its grid points missing. It now stops as for Ctrl-C: the running job is stopped and stored,
    the sweep is stored interrupted, the exit code is 141 (SIGPIPE's), and ``perfsweep resume``
    runs the rest."""
    import subprocess
    import sys

    from tests.util import TINY, finish, sqlite_rows, start_as_in_a_terminal, training, wait_for

    args = ["-m", "amp=true,false", "device=cpu", "profile.enabled=false", *TINY]
    with open(tmp_path / "stdout.txt", "w") as stdout:  # where stdout went is still read: it keeps its lines
        proc = subprocess.Popen(
            [sys.executable, "-m", "perfsweep", *args, "steps.measure=200"],
            cwd=tmp_path,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert proc.stderr is not None
    for line in proc.stderr:  # as `head` does: read until the first job trains, then stop reading
        if "measure step" in line:
            break
    proc.stderr.close()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE
    # only the closed stderr was silenced: the summary of the sweep's end reached stdout's file,
    # which went to /dev/null with it before
    assert "\nResults: sqlite:///" in (tmp_path / "stdout.txt").read_text()
    (sweep,) = sqlite_rows(tmp_path / "results.db", "SELECT id, status FROM sweeps")
    runs = sqlite_rows(tmp_path / "results.db", "SELECT status, error FROM runs ORDER BY job_num")
    assert sweep["status"] == "interrupted" and len(runs) < 2, runs
    # the job it stopped: interrupted, or ok where its result crossed the stop (kept, not rerun)
    assert all(r["status"] == "ok" or "(its output was closed)" in r["error"] for r in runs), runs
    # `perfsweep resume` passes a hangup on to the sweep it runs, which stops as it would have:
    # not orphaned to train on with nobody to see it
    resume = [sys.executable, "-m", "perfsweep", "resume", str(sweep["id"])]
    hung = start_as_in_a_terminal(resume, tmp_path, stderr_file=tmp_path / "resume.txt")
    wait_for(lambda: training(tmp_path / "resume.txt") or hung.poll() is not None)
    os.kill(hung.pid, signal.SIGHUP)  # the resume alone: the sweep hears it from it
    _, said = finish(hung, timeout=120)
    assert hung.returncode == 128 + signal.SIGHUP, said[-3000:]
    last = sqlite_rows(tmp_path / "results.db", "SELECT status, error FROM runs ORDER BY id DESC LIMIT 1")
    assert last[0]["status"] == "ok" or last[0]["error"].startswith("interrupted (SIGHUP)"), last
    res = subprocess.run(resume, cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    ok = sqlite_rows(tmp_path / "results.db", "SELECT DISTINCT job_num FROM runs WHERE status = 'ok'")
    assert len(ok) == 2, res.stderr[-3000:]


@pytest.mark.parametrize("under_nohup", [False, True], ids=["terminal", "nohup"])
def test_a_closed_terminal_stops_the_sweep_as_sigterm_does_unless_under_nohup(tmp_path, under_nohup: bool):
    """SIGHUP (the terminal closed, an SSH session dropped) killed the sweep on the spot by its
    default action: exit 129 with its rows left ``running`` until the next command. It now stops
    as for SIGTERM: the job is stored interrupted (SIGHUP), the sweep too, exit code 129. Under
    ``nohup`` (SIGHUP ignored) the sweep and its jobs go on. ``workers=2``: the job's DataLoader
    workers and the resource tracker get the hangup too."""
    import subprocess
    import sys
    import time

    from tests.util import TINY, finish, sqlite_rows, training

    err = tmp_path / "stderr.txt"
    grid = "amp=false" if under_nohup else "amp=true,false"  # under nohup: one job, which must go on
    args = ["-m", grid, "device=cpu", "profile.enabled=false", *TINY, "steps.measure=200", "workers=2"]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perfsweep", *args],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own group, as a terminal's session: the hangup reaches all of it
            preexec_fn=(lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if under_nohup else None,
        )
    proc.args_stderr_file = err  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120
    while (
        not training(err, serial_job="[1/1]" if under_nohup else "[1/2]")
        and proc.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGHUP)
    _, said = finish(proc, timeout=300)
    (sweep,) = sqlite_rows(tmp_path / "results.db", "SELECT status FROM sweeps")
    runs = sqlite_rows(tmp_path / "results.db", "SELECT status, error FROM runs ORDER BY job_num")
    if under_nohup:
        assert proc.returncode == 0 and sweep["status"] == "done", said[-3000:]
        assert [r["status"] for r in runs] == ["ok"], runs
        return
    assert proc.returncode == 128 + signal.SIGHUP, said[-3000:]
    # its stderr went to a file, which is still there: it keeps the sweep's last line (silenced before)
    assert said.splitlines()[-1].startswith("perfsweep: hung up (SIGHUP); no job had finished; run them with: "), said
    assert sweep["status"] == "interrupted" and len(runs) == 1, runs
    assert runs[0]["status"] == "interrupted" and runs[0]["error"].startswith("interrupted (SIGHUP)"), runs
    # the job, its DataLoader workers and the resource tracker took the hangup too: the job unwound
    # and shut its workers down (they and the tracker had died of it: semaphores left in /dev/shm,
    # and a tracker started again that knew none of them, a KeyError in job.log for each)
    (log,) = tmp_path.glob("multirun/*/*/0_*/job.log")
    text = log.read_text()
    assert not any(s in text for s in ("KeyError", "died unexpectedly", "killed by signal", "Traceback")), text[-3000:]
    # killed by the hangup (no handler of the job's own), its workers' semaphores leaked: the resource
    # tracker says so on the sweep's stderr, kept now that it goes to a file
    assert "leaked semaphore" not in said, said[-3000:]


def test_a_pipe_closed_during_the_summary_still_gets_the_sweep_its_report(tmp_path):
    """``perfsweep -m ... | head -3`` that stops reading in the summary, after the last job: the
    summary failed at its first unread line, the report was never written, and the sweep printed
    "could not print the summary". Every job is done and stored: it exits 0 with its report."""
    import subprocess
    import sys

    from tests.util import TINY, sqlite_rows

    args = ["-m", "amp=true,false", "device=cpu", "profile.enabled=false", *TINY, "report=true"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfsweep", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "stderr.txt", "w"),  # noqa: SIM115 - the child's; closed with the test's folder
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # the summary's first line: then stop reading, as head -1 does
    proc.stdout.close()
    said = (tmp_path / "stderr.txt").read_text
    assert proc.wait(timeout=300) == 0, said()[-3000:]
    (sweep,) = sqlite_rows(tmp_path / "results.db", "SELECT status, sweep_dir FROM sweeps")
    assert sweep["status"] == "done" and "could not print the summary" not in said(), said()[-3000:]
    assert (Path(sweep["sweep_dir"]) / "report" / "report.md").is_file(), said()[-3000:]


def test_a_note_the_hold_cannot_print_does_not_cut_the_bookkeeping_short(monkeypatch):
    """Ctrl-C, then the terminal closed while the jobs were being stopped: the hold printed its
    note to the gone terminal, the EIO cut the bookkeeping short, and rows were left running."""

    class Gone:
        def write(self, _text: str) -> int:
            raise OSError(5, "Input/output error")  # a hung-up terminal's EIO

        def flush(self) -> None:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr("sys.stderr", Gone())
    reached = []
    with pytest.raises(KeyboardInterrupt), interrupts.held("a note nobody can read"):
        signal.raise_signal(signal.SIGINT)
        reached.append("the bookkeeping went on")
    assert reached == ["the bookkeeping went on"]
