"""How a sweep stops: Ctrl-C and SIGTERM, and the bookkeeping they must not cut short.

Ctrl-C (SIGINT) and SIGTERM (``kill``, a CI runner's stop, a container's stop) both unwind a
sweep as :class:`KeyboardInterrupt`: the jobs in flight are stopped and stored ``interrupted``,
the sweep is marked, the summary is printed. A second signal while that is under way used to cut
it short and leave rows ``running``; :func:`held` delivers it once the bookkeeping is done. The
exit code says what stopped the sweep first (130 for Ctrl-C, 143 for SIGTERM), not what came
after. Torch-free: the sweeper and the entry point use it before torch is imported.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

STOPPING_NOTE = "perfsweep: stopping the running jobs and storing them first"
"""Printed when a second Ctrl-C or SIGTERM arrives while the first one's bookkeeping runs."""

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a sweep (SIGHUP: its terminal closed), held during its bookkeeping."""


class Terminated(KeyboardInterrupt):
    """SIGTERM to a sweep or run on this machine: unwound like Ctrl-C. (Under submitit each job
    handles its scheduler's signals itself: perfsweep.launcher.scheduler_signals.)"""


class HungUp(Terminated):
    """SIGHUP: the terminal the sweep ran in closed (an SSH session dropped). Stopped as for
    SIGTERM, with exit code 129; what it printed to the terminal goes to /dev/null first, since
    the terminal is gone (:func:`silence_output`; a file it printed to keeps its lines).
    Before, SIGHUP's default killed the sweep on the spot and left its rows ``running`` until the
    next command marked them. Not where it is ignored (``nohup``): that sweep goes on."""


class OutputClosed(KeyboardInterrupt):
    """The pipe or terminal the sweep prints to is gone (``perfsweep -m ... | head``, a closed
    SSH session's EIO): unwound as Ctrl-C is, so the running job is stored ``interrupted`` and the
    sweep closed ``interrupted`` for ``perfsweep resume``, with exit code 141 (128 + SIGPIPE, as a
    command killed by its pipe). Before, every later job failed on its first line and the sweep
    was stored ``done`` with its grid points missing. Raise it with :func:`output_closed`."""


_STOPS: tuple[tuple[type[KeyboardInterrupt], int], ...] = ((HungUp, signal.SIGHUP), (Terminated, signal.SIGTERM))
"""Which exception each stopping signal unwinds a sweep as, most derived first; SIGINT's is
KeyboardInterrupt. One table for the handlers, the redelivery, the exit code and the stored name."""


def signal_of(exc: BaseException) -> int:
    """The signal that ``exc`` (a :class:`KeyboardInterrupt` of ours) stands for: SIGINT unless
    :data:`_STOPS` names another."""
    return next((signum for kind, signum in _STOPS if isinstance(exc, kind)), signal.SIGINT)


def output_gone(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a write to a closed pipe (EPIPE) or a hung-up terminal (EIO)."""
    return isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno == errno.EIO)


def silence_output() -> None:
    """Send what this process prints from now on (the summary, the last line, a job's own output)
    to /dev/null on those of stdout and stderr that nobody reads any more: a pipe whose reader
    closed it (``| head``), a terminal hung up as it closed (what SIGHUP says). Each print there
    would fail again. The others keep it: ``perfsweep -m ... > sweep.log 2>&1`` started from a
    terminal that then closed lost its last lines, and ``2> >(head)`` its summary on stdout."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in _unread_outputs():
        os.dup2(devnull, fd)
    os.close(devnull)


def _unread_outputs() -> list[int]:
    """stdout and stderr where no one reads: the kernel's poll says POLLERR for a pipe whose
    reader is gone and for a hung-up terminal (POLLHUP with it), POLLNVAL for a closed descriptor;
    a file, /dev/null, a live terminal or pipe say POLLOUT alone."""
    poll = select.poll()
    for fd in (1, 2):
        poll.register(fd, select.POLLOUT)
    return sorted(fd for fd, events in poll.poll(0) if events & (select.POLLERR | select.POLLHUP | select.POLLNVAL))


def output_closed(exc: BaseException) -> OutputClosed:
    """The :class:`OutputClosed` to raise for ``exc``, the output silenced (:func:`silence_output`)."""
    silence_output()
    closed = OutputClosed()
    closed.__cause__ = exc
    return closed


_received: list[int] = []
"""The signals the ``perfsweep`` process's handlers got, in order (see :func:`raise_if_lost`)."""

_resent: list[int] = []
"""The signals :func:`redeliver_lost` sent again: each is in ``_received`` twice, one user's press."""


def raise_interrupt(signum: int, _frame: object) -> None:
    """The SIGINT handler of the ``perfsweep`` process: Python's, plus a record of it."""
    _received.append(signum)
    raise KeyboardInterrupt


def raise_terminated(signum: int, _frame: object) -> None:
    """The SIGTERM handler of the ``perfsweep`` process."""
    _received.append(signum)
    raise Terminated


def raise_hung_up(signum: int, _frame: object) -> None:
    """The SIGHUP handler of the ``perfsweep`` process (:class:`HungUp`)."""
    _received.append(signum)
    silence_output()
    raise HungUp


def unwind_on_hangup(signum: int, _frame: object) -> None:
    """The SIGHUP handler of a job process: a closed terminal's SIGHUP reaches the sweep's jobs too,
    and its default killed them outright, leaving their DataLoader's semaphores in /dev/shm (14 a
    job). Unwound as on Ctrl-C, its output still in job.log; the sweep then stores it."""
    raise HungUp


def unwind_once(signum: int, _frame: object) -> None:
    """The SIGINT, SIGTERM and SIGHUP handler of a data-parallel job's rank. The agent stops its ranks with
    SIGTERM, and a Ctrl-C reaches them too: killed outright, a rank left its DataLoader workers
    running and the resource tracker warned of leaked semaphores. Unwound, the workers are shut
    down; the first signal unwinds it, and later ones (the agent's SIGTERM after a Ctrl-C) are
    ignored, so they cannot cut that shutdown short. The agent's SIGKILL, 30 s on, still ends a
    rank stuck in a collective."""
    for sig in HELD_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def install() -> None:
    """Make Ctrl-C and SIGTERM unwind the ``perfsweep`` process, recorded for :func:`raise_if_lost`;
    one swallowed by a finalizer is raised again (:func:`redeliver_lost`)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it was ignored (`nohup`, `&`)
        signal.signal(signal.SIGINT, raise_interrupt)
    signal.signal(signal.SIGTERM, raise_terminated)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:  # not under nohup
        signal.signal(signal.SIGHUP, raise_hung_up)
    if sys.unraisablehook is not redeliver_lost:
        _unraisable.append(sys.unraisablehook)
        sys.unraisablehook = redeliver_lost


_unraisable: list[Callable[[Any], None]] = []
"""The unraisable hook :func:`install` replaced: every other unraisable exception goes to it."""


def redeliver_lost(unraisable: Any) -> None:
    """``sys.unraisablehook``: a Ctrl-C or SIGTERM whose exception landed in a finalizer or a
    garbage-collection callback is sent again, not printed. Python can only print and drop an
    exception raised there: a Ctrl-C as jobs started showed "Exception ignored in:
    WeakKeyDictionary..." with a traceback, and did nothing until the next job was due to start
    (:func:`raise_if_lost`). Sent again, the handler runs in the ordinary code that comes next."""
    exc = unraisable.exc_value
    if isinstance(exc, KeyboardInterrupt) and _received:
        # from another thread, a moment later: sent from here, the handler runs at once, inside this
        # hook, where its exception is lost again
        again = signal_of(exc)
        with contextlib.suppress(RuntimeError):  # no new thread at interpreter shutdown: nothing left to stop
            threading.Timer(0.01, os.kill, (os.getpid(), again)).start()
            _resent.append(again)
        return
    (_unraisable[-1] if _unraisable else sys.__unraisablehook__)(unraisable)


def raise_if_lost() -> None:
    """Raise again a signal whose exception was swallowed. A handler's exception that lands in a
    finalizer or a garbage-collection callback (multiprocessing's, SQLAlchemy's) is printed as
    "Exception ignored" and dropped, and the sweep went on to run every job and exit 0. Called
    before a job starts (:func:`perfsweep.launcher.launch`); a signal that did unwind the sweep
    never gets there."""
    if _received:
        raise next((kind for kind, signum in _STOPS if signum == _received[0]), KeyboardInterrupt)


def _hiding(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s context chain (``exc`` itself or one it unwound) whose context is
    a Ctrl-C or SIGTERM this process received and had not handled yet, if any. A handled one
    carries the hint on what to do next (``perfsweep_hint``): an error after it is perfsweep's own."""
    if not _received:
        return None
    link, seen = exc, {id(exc)}  # a chain set by hand may loop; Python only keeps a raise from closing one
    while (hidden := link.__context__) is not None and not isinstance(hidden, KeyboardInterrupt):
        if id(hidden) in seen:
            return None
        seen.add(id(hidden))
        link = hidden
    if hidden is None or getattr(hidden, "perfsweep_hint", None) is not None:
        return None
    return link


def hides_signal(exc: BaseException) -> bool:
    """Whether ``exc`` was raised as a Ctrl-C or SIGTERM unwound through a library (:func:`unmasked`)."""
    return _hiding(exc) is not None


@contextlib.contextmanager
def unmasked() -> Iterator[None]:
    """A Ctrl-C or SIGTERM that another exception hides comes out of this block as itself.

    The handler's exception lands wherever the main thread is, inside a library's cleanup too: a
    Ctrl-C as Hydra composed the next job's config stopped OmegaConf half way, whose ``finally``
    then raised ``AttributeError: 'NoneType' object has no attribute '_invalidate_flags_cache'``
    with the Ctrl-C as its context. The sweep stopped its jobs but ended with that traceback and
    exit code 1 (seen once in CI, a Ctrl-C as two jobs started on a loaded 2-core machine). An
    exception raised while a signal this process received unwinds it is that signal's consequence."""
    try:
        yield
    except Exception as exc:
        if (link := _hiding(exc)) is None:
            raise
        hidden = link.__context__
        assert isinstance(hidden, KeyboardInterrupt)
        logger.debug(
            "%s, raised as a signal unwound the sweep, is taken for that signal", type(exc).__name__, exc_info=exc
        )
        # raising it makes what hid it its context and cuts the chain there: what the signal itself
        # unwound (a SIGTERM before it) goes after what hid it, not away
        link.__context__ = hidden.__context__
        raise hidden  # noqa: B904 - its context keeps what hid it


def repeated() -> bool:
    """Whether a second Ctrl-C or SIGTERM came: the sweep then skips its summary. Counted from the
    handlers, so a signal held while a job was stopped (and delivered after) counts like one held
    while the sweep was closed."""
    return len(_received) - len(_resent) > 1


def first_signal() -> str | None:
    """``SIGINT`` or ``SIGTERM``: the first signal this process's handlers received, if any."""
    return signal.Signals(_received[0]).name if _received else None


@contextlib.contextmanager
def held(note: str | None = None) -> Iterator[None]:
    """Ctrl-C and SIGTERM during this bookkeeping are held until it is done, then delivered as
    they would have been (the first one that came, to the handler that was in place). ``note``
    is printed when one arrives, so a user who presses Ctrl-C again knows why nothing stopped.
    Only the main thread receives signals; elsewhere this holds nothing.

    A signal the process ignores (SIGINT where it was started in the background: a script's
    ``&``, ``nohup``) stays ignored: none arrives to hold, and the job server and spawned jobs,
    started under this hold, inherit its disposition. A handler of ours there became theirs as
    the default, and a Ctrl-C meant for the terminal's foreground interrupted the jobs of a
    sweep that went on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:  # the terminal is gone: the note, and all after it, would fail there
            silence_output()
        if note and not pending and not _noted:  # once: an inner hold passes its signal to the outer one
            with contextlib.suppress(OSError):  # a closed pipe must not cut the bookkeeping short
                print(note, file=sys.stderr, flush=True)
            _noted.append(note)
        pending.append(signum)

    outermost = not _holding
    _holding.append(hold)
    try:
        with handled([s for s in HELD_SIGNALS if signal.getsignal(s) != signal.SIG_IGN], hold) as previous:
            yield
    finally:
        _holding.pop()
        if outermost:
            _noted.clear()
    if pending:
        _deliver(pending[0], previous[pending[0]])


def release_logging_locks() -> None:
    """Release logging's module lock and every handler's lock that this thread holds; call where it
    cannot hold them rightly.

    CPython checks for signals between a logging call taking such a lock and the ``try`` that
    releases it, so a Ctrl-C landing there leaves the main thread owning it for good. The module
    lock is taken by Hydra's logging setup, run for each job the main thread starts; a handler's
    lock by every record it writes (``Handler.handle``: ``acquire()``, then ``try``), Hydra's line
    for each job launched among them. Every other thread's next log call through that lock then
    waits forever: the sweep, joining its job threads to store them, hung (the module lock: 1
    Ctrl-C in about 15 while jobs started, on a loaded 2-core machine; a sweep of 2 concurrent
    jobs stopped printing after its job headers once in a CI run, Ctrl-C while they started)."""
    handlers = [ref() for ref in list(getattr(logging, "_handlerList", []))]
    locks = [getattr(logging, "_lock", None), *(getattr(h, "lock", None) for h in handlers if h is not None)]
    for lock in locks:
        owned = getattr(lock, "_is_owned", None)  # CPython's RLock
        while owned is not None and owned():
            lock.release()


@contextlib.contextmanager
def handled(signals: Iterable[int], handler: Callable[[int, Any], None]) -> Iterator[dict[int, Any]]:
    """``handler`` for ``signals`` within the block; yields the handlers it replaced, put back after."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield previous
    finally:
        for sig, replaced in previous.items():
            signal.signal(sig, replaced)


_holding: list[Any] = []
"""The holds in force, outermost first."""
_noted: list[str] = []
"""The note printed under the holds in force: one is enough."""


def holding() -> bool:
    """Whether a :func:`held` block is in force: a stop now waits for it to end."""
    return bool(_holding)


def _deliver(signum: int, handler: Any) -> None:
    if callable(handler):
        handler(signum, None)  # Python's Ctrl-C handler raises KeyboardInterrupt; ours raise theirs
    elif handler == signal.SIG_IGN:
        return
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:  # SIG_DFL (or a handler set outside Python): the signal's own action, now
        os.kill(os.getpid(), signum)


def hint_of(exc: BaseException) -> str | None:
    """What to do after Ctrl-C (``perfsweep_hint``), as set where it is known (the sweeper, the
    summary, a plain run). A second Ctrl-C while the first unwinds carries the first one as its
    context; the first one's hint wins, since what it stopped is what is left to do (a resume also
    builds the report)."""
    hint, seen = None, exc
    while seen is not None:
        hint = getattr(seen, "perfsweep_hint", None) or hint
        seen = seen.__context__
    return hint


def first_cause(exc: BaseException) -> BaseException:
    """The signal that began the unwinding: a Ctrl-C held and delivered after a SIGTERM carries
    the SIGTERM as its context, and the exit code and message are the first one's."""
    first, seen = exc, exc.__context__
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            first = seen
        seen = seen.__context__
    return first


def exit_code(exc: BaseException) -> int:
    """The exit code of a sweep or run that ``exc`` stopped: 128 plus the first signal's number
    (:func:`first_cause`), SIGPIPE's for :class:`OutputClosed`."""
    first = first_cause(exc)
    return 128 + (signal.SIGPIPE if isinstance(first, OutputClosed) else signal_of(first))


def how_stopped(exc: BaseException) -> str:
    """The sweep's last line's words for what stopped it (:func:`first_cause`)."""
    first = first_cause(exc)
    if isinstance(first, OutputClosed) or output_gone(first):
        return "stopped: its output was closed"
    if isinstance(first, Terminated):
        return f"{'hung up' if isinstance(first, HungUp) else 'terminated'} ({signal_name(first)})"
    return "interrupted"


def signal_name(exc: BaseException) -> str:
    """What stopped a job, as its stored error says it: ``SIGTERM`` or ``SIGINT`` for the signal
    that began the unwinding (:func:`first_cause`), else the exception's type (a cancel, a rank's
    ``SignalException``)."""
    first = first_cause(exc)
    if isinstance(first, OutputClosed) or output_gone(first):
        return "its output was closed"
    if isinstance(first, Terminated) or type(first) is KeyboardInterrupt:
        return signal.Signals(signal_of(first)).name
    return type(first).__name__
