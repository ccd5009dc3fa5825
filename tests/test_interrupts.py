"""perfsweep.interrupts: a second Ctrl-C or SIGTERM waits for the bookkeeping, then is delivered
as it would have been. Real signals to this process; the main thread receives them."""

from __future__ import annotations

import io
import logging
import signal
import threading
from pathlib import Path

import pytest

from perfsweep import interrupts


def test_a_signal_during_the_hold_is_delivered_after_it_to_the_handler_that_was_in_place(capsys):
    done = []
    previous = signal.signal(signal.SIGTERM, interrupts.raise_terminated)
    try:
        with pytest.raises(interrupts.Terminated), interrupts.held("held, wait"):
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGINT)  # a second one is not delivered as well
            done.append("stored")
        assert done == ["stored"]
        assert capsys.readouterr().err.count("held, wait") == 1  # said once, not per signal
        assert signal.getsignal(signal.SIGTERM) is interrupts.raise_terminated
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
        interrupts._received.clear()


def test_a_second_signal_held_and_delivered_counts_as_repeated():
    """A second Ctrl-C skips the summary wherever it was held: it counts from the handlers."""
    previous = signal.signal(signal.SIGINT, interrupts.raise_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert not interrupts.repeated()
        with pytest.raises(KeyboardInterrupt), interrupts.held():
            signal.raise_signal(signal.SIGINT)
        assert interrupts.repeated()
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupts._received.clear()


def test_an_ignored_signal_stays_ignored_and_nothing_held_raises_nothing():
    """A SIGTERM ignored before the hold (``nohup``, a parent's choice) is still ignored after it:
    put back as the default, the next SIGTERM would kill the process."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with interrupts.held():
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        with interrupts.held():
            pass
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        signal.raise_signal(signal.SIGTERM)  # ignored: the test goes on
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_ignored_signal_stays_ignored_during_the_hold_for_what_starts_there():
    """The job server and spawned jobs start under a hold and inherit the disposition it leaves:
    a handler of ours there became the default in them (an exec keeps only SIG_IGN)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.held():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # not ignored: held
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def _agent_takes_signals() -> bool:
    from torch.distributed.launcher.api import LaunchConfig

    return "signals_to_handle" in LaunchConfig.__dataclass_fields__


@pytest.mark.parametrize(
    ("start_method", "ranks"),
    [
        ("forkserver", []),
        ("spawn", []),
        pytest.param(
            "forkserver",
            ["nproc=2"],
            marks=pytest.mark.skipif(
                not _agent_takes_signals(),
                reason="this torch's elastic agent has no signals_to_handle: it handles SIGINT whatever it is told",
            ),
            id="nproc",
        ),
    ],
)
def test_a_sweep_started_with_ctrl_c_ignored_keeps_its_jobs_ignoring_it(tmp_path, start_method: str, ranks: list):
    """A sweep started in the background of a script (``perfsweep -m ... &``: the shell ignores
    SIGINT for it) ignores Ctrl-C, and so must its jobs: a Ctrl-C meant for the terminal's
    foreground command reached the whole group and interrupted the running job, while the sweep
    went on to the next (its job server and spawned jobs were started under a handler of ours,
    which they took as the default). An ``nproc`` job's elastic agent installed its own SIGINT
    handler, and was stored ``interrupted (SignalException: ... got signal: 2)``."""
    import os
    import subprocess
    import sys
    import time

    from tests.util import TINY, finish, sqlite_rows, training

    err = tmp_path / "stderr.txt"
    args = ["-m", "seed=0", f"launcher.start_method={start_method}", "device=cpu", "profile.enabled=false", *ranks]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perfsweep", *args, *TINY, f"steps.measure={150 if ranks else 400}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own group, as a script's: the Ctrl-C goes to all of it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `&` in a script does
        )
    proc.args_stderr_file = err  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120
    while not training(err) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    _, said = finish(proc, timeout=300)
    assert proc.returncode == 0, said[-3000:]
    (run,) = sqlite_rows(tmp_path / "results.db", "SELECT status FROM runs")
    assert run["status"] == "ok" and "interrupted" not in said, said[-3000:]


@pytest.mark.parametrize(
    ("ranks", "slack_s"),
    [
        ([], 3),
        # the agent stops its ranks with SIGTERM: killed, they left their workers running (seen
        # for 86 s) and semaphores leaked; unwound, the stop took 10.3 s for timeout_s=8 (8.3 before).
        # A loose bound: the stop of an agent, 2 ranks and 4 workers took 1.6-2.8 s idle and 6.0-7.7 s
        # beside two busy loops on 2 cores, where a slack of 8 failed once in a full run. Skipping
        # the SIGINT is _stop's, shared with the case above, which times it closely
        pytest.param(["nproc=2"], 15, id="nproc"),
    ],
)
def test_a_job_timed_out_where_ctrl_c_is_ignored_is_stopped_without_waiting_on_it(tmp_path, ranks, slack_s):
    """The sweep stops a job that ran past timeout_s with SIGINT first, then SIGTERM 5 s later;
    where its jobs ignore SIGINT (the sweep does), the stop starts at SIGTERM: it took 16.1 s
    against 6.1 s for timeout_s=6 before. The job unwinds on it as on Ctrl-C, and so do an
    ``nproc`` job's ranks, on the SIGTERM their agent stops them with."""
    import re
    import subprocess
    import sys

    from tests.util import TINY, sqlite_rows

    args = ["-m", "seed=0", "device=cpu", "profile.enabled=false", "timeout_s=4", *TINY, "steps.measure=100000"]
    args += ["workers=2", *ranks]  # DataLoader workers: the stop must unwind the job and shut them down
    res = subprocess.run(
        [sys.executable, "-m", "perfsweep", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,  # workers left running keep stderr open: the run then never ends
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as `&` in a script does
    )
    (run,) = sqlite_rows(tmp_path / "results.db", "SELECT status FROM runs")
    took = re.search(r"-> timeout in ([\d.]+) s", res.stderr)
    assert run["status"] == "timeout" and took is not None, res.stderr[-3000:]
    assert float(took[1]) < 4 + slack_s, took[0]  # no 5 s wait on a SIGINT the job ignores
    # unwound by the SIGTERM, not killed: its workers were shut down (killed, the job left them
    # running, and the resource tracker warned of leaked semaphores once they were gone)
    assert "leaked semaphore" not in res.stderr, res.stderr[-3000:]
    left = subprocess.run(["pgrep", "pt_data_worker"], capture_output=True, text=True).stdout.split()  # by name
    assert not [p for p in left if str(tmp_path) in Path(f"/proc/{p}/cwd").resolve().as_posix()], left


def test_the_first_signal_decides_how_the_sweep_stopped():
    """SIGTERM, then a Ctrl-C held while the jobs stopped: it ends as terminated (exit 143)."""
    try:
        try:
            raise interrupts.Terminated
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None  # `from None` hides the context from tracebacks, not __context__
    except KeyboardInterrupt as second:
        assert isinstance(interrupts.first_cause(second), interrupts.Terminated)
        assert interrupts.signal_name(second) == "SIGTERM"  # what a stopped job's stored error says
    plain = KeyboardInterrupt()
    assert interrupts.first_cause(plain) is plain and interrupts.signal_name(plain) == "SIGINT"
    assert interrupts.signal_name(RuntimeError()) == "RuntimeError"


def test_nested_holds_say_their_note_once(capsys):
    """Stopping the jobs holds signals, and closing the sweep inside it holds them again: a signal
    under both is one note, delivered once both are done."""
    reached = []
    with pytest.raises(KeyboardInterrupt), interrupts.held("outer note"):
        with interrupts.held("inner note"):
            signal.raise_signal(signal.SIGINT)
        reached.append("after the inner hold")  # the inner hold hands the signal on, not raises it
        signal.raise_signal(signal.SIGINT)
        reached.append("end of the outer hold")
    assert reached == ["after the inner hold", "end of the outer hold"]  # delivered once both were done
    err = capsys.readouterr().err
    assert err.count("note") == 1 and "inner note" in err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowing itself
def test_a_swallowed_signal_stops_the_next_job_from_starting():
    """A handler's exception raised inside a finalizer is printed as "Exception ignored" and lost;
    the signal is recorded, and the next job does not start."""
    from perfsweep import launcher

    previous = signal.signal(signal.SIGTERM, interrupts.raise_terminated)
    try:

        class Finalized:
            def __del__(self):
                signal.raise_signal(signal.SIGTERM)  # the handler's Terminated is swallowed here

        Finalized()  # collected at once: "Exception ignored in ... __del__"
        with pytest.raises(interrupts.Terminated):
            launcher.launch(None)  # raised before anything about the job is looked at
    finally:
        signal.signal(signal.SIGTERM, previous)
        interrupts._received.clear()


def test_a_logging_lock_left_by_an_interrupt_is_released():
    """A Ctrl-C between a logging call taking the module lock and its ``try`` left the main thread
    owning it: a job thread's next log call waited forever and the sweep hung stopping them."""
    logging._lock.acquire()  # what the interrupted call left behind (twice: the RLock is reentrant)
    logging._lock.acquire()
    logged = threading.Event()

    def job_thread() -> None:
        logging.getLogger("perfsweep.test").info("stored")
        logged.set()

    thread = threading.Thread(target=job_thread, daemon=True)
    thread.start()
    try:
        assert not logged.wait(0.5)  # blocked on the lock the main thread holds
        interrupts.release_logging_locks()
        assert logged.wait(5)
    finally:
        while logging._lock._is_owned():
            logging._lock.release()
    interrupts.release_logging_locks()  # nothing held: nothing to do
    thread.join(5)


def test_a_handler_lock_left_by_an_interrupt_is_released():
    """The same window in every handler: ``Handler.handle`` takes the handler's lock, then enters
    its ``try``. A Ctrl-C there (Hydra logs a line in the main thread for each job it launches)
    left the main thread owning the console handler's lock, and a job thread logging through it
    waited forever."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("perfsweep.test.handler")
    logger.addHandler(handler)
    logger.propagate = False
    handler.acquire()  # what the interrupted handle() left behind
    logged = threading.Event()

    def job_thread() -> None:
        logger.warning("stored")
        logged.set()

    thread = threading.Thread(target=job_thread, daemon=True)
    thread.start()
    try:
        assert not logged.wait(0.5)  # blocked on the handler's lock, which the main thread holds
        interrupts.release_logging_locks()
        assert logged.wait(5) and stream.getvalue() == "stored\n"
    finally:
        while handler.lock._is_owned():
            handler.release()
        logger.removeHandler(handler)
    thread.join(5)


def test_a_signal_that_lands_in_a_finalizer_is_sent_again_not_printed():
    """A Ctrl-C whose KeyboardInterrupt is raised inside a garbage-collection callback can only be
    printed and dropped by Python ("Exception ignored in: ... KeyboardInterrupt"); with perfsweep's
    handlers installed it is sent again and stops the code that runs next. In a fresh process:
    install() replaces this one's handlers and unraisable hook."""
    import subprocess
    import sys

    script = (
        "import signal, sys, time, weakref\n"
        "from perfsweep import interrupts\n"
        "interrupts.install()\n"
        "class Thing: pass\n"
        "def callback(_ref):\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "    sum(range(1000))  # the handler runs here, inside the callback\n"
        "    print('callback went on', file=sys.stderr)\n"
        "thing = Thing()\n"
        "ref = weakref.ref(thing, callback)\n"
        "try:\n"
        "    del thing\n"
        "    end = time.monotonic() + 30\n"
        "    while time.monotonic() < end:  # ordinary code: stopped here at once, or after 30 s not at all\n"
        "        pass\n"
        "    print('not stopped')\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped', interrupts.first_signal(), 'twice' if interrupts.repeated() else 'once')\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "stopped SIGINT once", res.stdout + res.stderr  # sent again: still one press
    assert "Exception ignored" not in res.stderr and "callback went on" not in res.stderr, res.stderr


def test_a_signal_that_another_exception_hides_is_unwound_as_itself():
    """A library's cleanup that fails as the Ctrl-C passes through it hides it behind its own
    error; the block gives the Ctrl-C back (SIGTERM too), and leaves other errors alone."""
    interrupts._received.append(signal.SIGTERM)
    try:
        with pytest.raises(interrupts.Terminated) as raised, interrupts.unmasked():
            try:
                raise interrupts.Terminated
            finally:
                raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
        assert isinstance(raised.value.__context__, AttributeError)  # kept for the log's traceback
        assert interrupts.signal_name(raised.value) == "SIGTERM"
        with pytest.raises(ValueError), interrupts.unmasked():  # nothing hidden: as it was
            raise ValueError("bad")
    finally:
        interrupts._received.clear()
    with pytest.raises(AttributeError), interrupts.unmasked():  # a KeyboardInterrupt no signal sent: a bug, shown
        try:
            raise KeyboardInterrupt
        finally:
            raise AttributeError("x")


def test_a_hidden_signal_keeps_what_it_unwound():
    """A Ctrl-C held and delivered after a SIGTERM carries the SIGTERM (and its hint) as its
    context; unmasked keeps them after what hid it: the exit code and hint are the first one's."""
    interrupts._received.extend([signal.SIGTERM, signal.SIGINT])
    try:
        with pytest.raises(KeyboardInterrupt) as raised, interrupts.unmasked():
            try:
                try:
                    first = interrupts.Terminated()
                    first.perfsweep_hint = "resume it"
                    raise first
                finally:
                    raise KeyboardInterrupt
            finally:
                raise AttributeError("cleanup")
    finally:
        interrupts._received.clear()
    assert isinstance(raised.value.__context__, AttributeError)
    assert interrupts.first_cause(raised.value) is first


def test_an_error_after_the_signal_was_handled_is_shown_as_itself():
    """Once perfsweep has handled a Ctrl-C (its hint on what to do next is set), an error in what
    follows, the summary say, is perfsweep's own bug: shown, not taken for the Ctrl-C."""
    interrupts._received.append(signal.SIGINT)
    try:
        with pytest.raises(RuntimeError, match="summary bug"), interrupts.unmasked():
            try:
                handled = KeyboardInterrupt()
                handled.perfsweep_hint = "the run is stored as interrupted; run the command again to measure it"
                raise handled
            except KeyboardInterrupt:
                raise RuntimeError("summary bug")  # noqa: B904 - the chain is the point
        assert not interrupts.hides_signal(RuntimeError("no context"))
    finally:
        interrupts._received.clear()


# Ctrl-C as Hydra composes the second job's config: OmegaConf stops half way and its own cleanup
# fails, so an AttributeError with the Ctrl-C as its context reaches the sweeper. Seen in CI once
# (test_scale_out's Ctrl-C while jobs start); made to happen every time here.
CTRL_C_IN_HYDRA = """
import signal, sys
import hydra._internal.config_loader_impl as loader

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even under a `&` test runner
compose = loader.ConfigLoaderImpl.load_sweep_config

def ctrl_c_inside(self, master_config, sweep_overrides):
    launching = sys._getframe(1).f_globals["__name__"].endswith("basic_launcher")  # not the sweeper's checks
    if launching and "sweep.grid_index=1" in sweep_overrides:
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
    return compose(self, master_config, sweep_overrides)

loader.ConfigLoaderImpl.load_sweep_config = ctrl_c_inside
if __name__ == "__main__":  # not in the job processes, which import this module again
    from perfsweep.__main__ import cli

    cli()
"""


@pytest.mark.slow
def test_a_ctrl_c_hidden_by_hydra_s_cleanup_stops_the_sweep_as_a_ctrl_c(tmp_path):
    import subprocess
    import sys

    from tests.util import TINY, sqlite_rows

    script = tmp_path / "ctrl_c_in_hydra.py"
    script.write_text(CTRL_C_IN_HYDRA)
    args = ["-m", "amp=false,true", "device=cpu", "profile.enabled=false", *TINY]
    res = subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 130, res.stderr[-3000:]  # was 1, after the AttributeError's traceback
    assert "Traceback" not in res.stderr and "AttributeError" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1].startswith("perfsweep: interrupted; 1 of 2 jobs finished and are stored")
    db = tmp_path / "results.db"
    assert [r["status"] for r in sqlite_rows(db, "SELECT status FROM runs ORDER BY job_num")] == ["ok"]
    assert [r["status"] for r in sqlite_rows(db, "SELECT status FROM sweeps")] == ["interrupted"]


# Ctrl-C just after a command has answered (its last line printed, back in main()), where no
# handler of the command's is left: it was a traceback under that line.
CTRL_C_AS_A_COMMAND_RETURNS = """
import signal
import perfsweep.__main__ as entry

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even under a `&` test runner
answer = entry._subcommand

def answered_then_ctrl_c(name, argv):
    code = answer(name, argv)
    signal.raise_signal(signal.SIGINT)
    return code

entry._subcommand = answered_then_ctrl_c
entry.cli()
"""


def test_a_ctrl_c_after_a_command_answered_is_one_line_not_a_traceback(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "ctrl_c_after.py"
    script.write_text(CTRL_C_AS_A_COMMAND_RETURNS)
    res = subprocess.run(
        [sys.executable, str(script), "trace", str(tmp_path / "nosuch.json")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = res.stderr.strip().splitlines()
    assert "Traceback" not in res.stderr and "KeyboardInterrupt" not in res.stderr, res.stderr
    assert lines[0].startswith("perfsweep trace: ") and "nosuch.json" in lines[0], res.stderr  # its answer stays
    assert lines[1:] == ["perfsweep: interrupted"], res.stderr
    assert res.returncode == 130


# Starts the command as `python -m perfsweep --help` does, sending this process a real SIGINT as
# the command first imports the module named in argv[1]; with argv[2] "hidden", a library's cleanup
# then raises another exception over it, as OmegaConf's does when a Ctrl-C stops it half way.
CTRL_C_IN_THE_IMPORTS = """
import os, runpy, signal, sys, time

module, hidden = sys.argv[1], sys.argv[2] == "hidden"

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # the KeyboardInterrupt comes here
            finally:
                if hidden:
                    raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = ["perfsweep", "--help"]
runpy.run_module("perfsweep", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    ("module", "how"),
    [
        ("socket", "alone"),
        ("sqlalchemy", "alone"),
        ("hydra_plugins.perfsweep_sweeper", "alone"),
        ("sqlalchemy", "hidden"),
        ("hydra_plugins.perfsweep_sweeper", "hidden"),
    ],
    ids=["stdlib", "imports", "plugin-scan", "imports-hidden", "plugin-scan-hidden"],
)
def test_a_ctrl_c_in_the_commands_first_imports_is_one_line_not_a_traceback(module, how, tmp_path):
    """In the imports of perfsweep.__main__ (the standard library's; SQLAlchemy's, through
    perfsweep.store) and in Hydra's plugin scan that follows them: the first half second of every
    command, where a Ctrl-C printed a traceback through the import machinery. Also where a
    library's cleanup raises another exception over it (OmegaConf's AttributeError, 1 Ctrl-C in
    120 at random moments of `perfsweep --help` in a review)."""
    import subprocess
    import sys

    script = tmp_path / "ctrl_c_in_imports.py"
    script.write_text(CTRL_C_IN_THE_IMPORTS)
    res = subprocess.run(
        [sys.executable, str(script), module, how], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert res.stderr.strip().splitlines() == ["perfsweep: interrupted"], res.stderr[-3000:]
    assert res.returncode == 130 and not res.stdout, (res.returncode, res.stdout[-500:])


def test_an_nproc_agent_is_told_to_leave_every_ignored_signal_alone():
    """A script's ``&`` ignores SIGINT and SIGQUIT, ``nohup`` SIGHUP: an ``nproc`` job's elastic
    agent handled each as its own stop (stored ``interrupted (SignalException ... got signal: 1)``
    for a SIGHUP the sweep ignored). SIGTERM is kept: the sweep stops a job with it."""
    from torch.distributed.launcher.api import LaunchConfig

    from perfsweep.distributed import _keep_ignored

    if not _agent_takes_signals():
        pytest.skip("this torch's elastic agent has no signals_to_handle: it handles them whatever it is told")
    names = ("SIGINT", "SIGHUP", "SIGQUIT", "SIGTERM")
    before = {n: signal.getsignal(getattr(signal, n)) for n in names}
    try:
        for n in names:  # none ignored (a suite run under nohup ignores SIGHUP): torch's own default
            signal.signal(getattr(signal, n), signal.default_int_handler if n == "SIGINT" else signal.SIG_DFL)
        assert _keep_ignored(LaunchConfig) == {}
        for n in names:
            signal.signal(getattr(signal, n), signal.SIG_IGN)
        assert _keep_ignored(LaunchConfig) == {"signals_to_handle": "SIGTERM"}
        # only nohup's SIGHUP (and SIGTERM, kept) ignored; not what the suite inherited, which a
        # suite started with & has ignored too (SIGQUIT: its CI run on 2026-11-28 failed here)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        assert _keep_ignored(LaunchConfig) == {"signals_to_handle": "SIGTERM,SIGINT,SIGQUIT"}
    finally:
        for n, handler in before.items():
            signal.signal(getattr(signal, n), handler)
