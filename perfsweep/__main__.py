"""``python -m perfsweep`` / ``perfsweep``: Hydra entry point, one call per grid point.

In a multirun, perfsweep's sweeper (hydra_plugins/perfsweep_sweeper) has already checked
every grid point (perfsweep.preflight) and prints the summary at the end; in a single run this
function does both, with the same checks, so a mistake gets the same one line either way.
"""

from __future__ import annotations

import contextlib
import signal
import sys


def _interrupted_while_starting(exc: BaseException) -> None:
    """End a Ctrl-C in the command's first half second (the imports below, Hydra's plugin scan) as
    one anywhere later does (:func:`cli`): it printed a traceback through Hydra's or SQLAlchemy's
    imports instead. Also one that another exception hides (perfsweep.interrupts.unmasked: OmegaConf,
    stopped half way in Hydra's config store, raises AttributeError from its ``finally``; that
    module is not imported yet, so the chain is walked here); any other ``exc`` is raised again."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, KeyboardInterrupt):
        seen = seen.__context__
    if seen is None:
        raise exc
    print("perfsweep: interrupted", file=sys.stderr)
    raise SystemExit(128 + signal.SIGINT)


try:
    import logging
    import os
    import socket
    from pathlib import Path
    from typing import Any

    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig, OmegaConf

    from perfsweep import interrupts, preflight, store
    from perfsweep.cli import UserError
    from perfsweep.config import MAX_BATCH, ConfigError, register_configs, to_run_config
    from perfsweep.names import EXIT_0_STATUSES, FINAL_STATUSES, NOT_OVERRIDES, STACKS_ENV
except BaseException as exc:  # noqa: BLE001 - anything else is raised again
    _interrupted_while_starting(exc)

# torch, pandas and SQLAlchemy are imported inside hydra_main: a typo, --help or a subcommand
# answers in about a second instead of paying for torch first.


def register() -> None:
    """Make perfsweep's configs and sweeper known to Hydra (idempotent).

    Hydra's plugin scan runs first (it re-executes the plugin modules it finds, so importing ours
    before it would leave two PerfsweepSweeper classes); then the sweeper is registered by hand,
    because the scan cannot list the ``hydra_plugins`` namespace of an editable install. This
    lives here, at the top of the import graph, so that perfsweep.config imports only what it
    validates and no module imports the sweeper, which imports the launcher, back.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    from hydra_plugins.perfsweep_sweeper import PerfsweepSweeper

    plugins.register(PerfsweepSweeper)
    register_configs()


class _SaidByPerfsweep(logging.Filter):
    """Hydra's basic launcher logs "Launching 4 jobs locally" and each job's overrides ("#0 : amp=True
    ... sweep.id=1 ..."), timestamped among perfsweep's lines; perfsweep says both already, for
    people ("perfsweep: 4 jobs, one process each", "[1/4] amp=True ..."), without its own
    ``sweep.*`` bookkeeping (perfsweep.config.SweepContext). Its warnings and errors still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO


class _PasswordsHidden(logging.Filter):
    """Hydra's joblib and submitit launchers log each job's overrides ("#0 : ... db.url=...") as
    typed: a database password went to the terminal in clear, where perfsweep's own lines hide it
    (perfsweep.cli.hide_password)."""

    def filter(self, record: logging.LogRecord) -> bool:
        said = record.getMessage()
        if (hidden := store.hide_password(said)) != said:
            record.msg, record.args = hidden, None
        return True


LAUNCHER_LOGGERS = (
    "hydra._internal.core_plugins.basic_launcher",
    "hydra_plugins.hydra_joblib_launcher._core",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
)
"""The loggers of the Hydra launchers perfsweep runs on, named as their modules are."""

try:
    register()
except BaseException as exc:  # noqa: BLE001 - anything else is raised again
    _interrupted_while_starting(exc)
logging.getLogger(LAUNCHER_LOGGERS[0]).addFilter(_SaidByPerfsweep())
for _name in LAUNCHER_LOGGERS:
    logging.getLogger(_name).addFilter(_PasswordsHidden())
# torch's loggers at WARNING, as torch's import sets them as it ends (with TORCH_LOGS's levels, which
# it sets after): an import of torch in this process cut short by a Ctrl-C left them at Hydra's INFO,
# and torch's exit handlers then printed "FakeTensor cache stats" under the sweep's last line
logging.getLogger("torch").setLevel(logging.WARNING)
log = logging.getLogger("perfsweep")


_task_started = False
"""Whether Hydra got as far as :func:`hydra_main`: an OSError before it is Hydra failing to write
the run's folder, answered in one line (:func:`unwritable_run_folder`); one after it is a bug."""

_folder_watched = False
"""Whether :func:`hydra_main` has reached the ``try`` that hands a refused or stopped plain run's
folder back; a stop before it (as Hydra made the folder, say) is main()'s to clean up."""


def _grid_left_out(hc: Any, cfg: Any) -> tuple[str, str]:
    """The grid a config defines (``hydra.sweeper.params``, as experiments/*.yaml do) for keys a
    plain run was not given, and the values the run takes for them instead (from ``cfg``):
    ``-cn amp_ckpt`` without ``-m`` ran one job (amp and ckpt off), without a word of the other
    three. Empty where the config has no grid or every key of it was given a value; a key with
    one value is no grid."""
    given = {o.split("=", 1)[0].lstrip("+") for o in hc.overrides.task if not o.startswith("~")}
    params = hc.sweeper.get("params") or {}
    left = {k: str(v) for k, v in params.items() if k not in given and ("," in str(v) or "(" in str(v))}
    values = {k: OmegaConf.select(cfg, k) for k in left}
    taken = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items())
    return " ".join(f"{k}={v}" for k, v in left.items()), taken


@hydra.main(version_base="1.3", config_path="pkg://perfsweep.conf", config_name="config")
def hydra_main(cfg: DictConfig) -> str:
    global _task_started, _folder_watched
    _task_started = True
    hc = HydraConfig.get()
    if hc.output_subdir is not None:  # Hydra has written the job's settings there, a password in clear
        hydra_files = Path(hc.runtime.output_dir, hc.output_subdir)
        preflight.hide_passwords_in_files(
            *(hydra_files / name for name in ("config.yaml", "hydra.yaml", "overrides.yaml"))
        )
    multirun = hc.mode == RunMode.MULTIRUN
    launch_dir = Path(hc.runtime.cwd)
    sweep_dir = str(Path(hc.sweep.dir if multirun else hc.run.dir).resolve())
    command = store.typed_command()
    claim: preflight.Claim | None = None
    sweep_id = None
    try:
        _folder_watched = True
        run_cfg = to_run_config(cfg)
        if not multirun:  # the sweeper has checked every grid point of a multirun already
            if run_cfg.resume:
                raise ConfigError(
                    "invalid config: resume=true: only a multirun sweep can be resumed; use perfsweep resume SWEEP"
                )
            if run_cfg.order.value != "grid":
                raise ConfigError(
                    f"invalid config: order={run_cfg.order.value}: orders the rounds of a multirun; add -m"
                )
            if run_cfg.batch == MAX_BATCH:
                raise ConfigError(
                    "invalid config: batch=max: searches with several jobs, each in its own process; add -m"
                )
            if run_cfg.launcher.parallel > 1:
                raise ConfigError(
                    f"invalid config: launcher.parallel={run_cfg.launcher.parallel}: runs the jobs of a multirun "
                    "side by side; add -m"
                )
            if run_cfg.repeat > 1:
                raise ConfigError(
                    f"invalid config: repeat={run_cfg.repeat}: repeats run as a multirun, each in its own "
                    "process; add -m"
                )
        if not multirun:
            from perfsweep import job_start

            job_start.start_early([run_cfg], dict(hc.job.env_set or {}))  # the server imports while we do
        from perfsweep import importer, launcher, summary  # torch, once the config is known to be valid

        if not multirun:
            with interrupts.held():  # a stop as the folder is claimed comes once it is, and is handed back
                claim = preflight.claim_folder(Path(sweep_dir), "hydra.run.dir", launch_dir=launch_dir)
            preflight.data_keys_read([(list(hc.overrides.task), run_cfg)])  # one point: read, or refused
            preflight.check_db_url(launcher.db_url(run_cfg, launch_dir))  # before torch is asked for a GPU
            found = preflight.check_all([run_cfg])  # and nproc's ranks fit this machine
            sweep_id, cpu = preflight.reserve_sweep(
                launcher.db_url(run_cfg, launch_dir),
                sweep_dir,
                run_cfg.name or hc.job.config_name or "perfsweep",
                claim,
                command=command,
                n_jobs=1,
                hostname=socket.gethostname(),
                launch_dir=str(launch_dir.resolve()),
                parallel=1,
                measure=lambda: preflight.cpu_sweep_fields([run_cfg]),
            )
            for notice in preflight.start_notices(cpu, [run_cfg], found):
                print(notice, file=sys.stderr)
            grid, taken = _grid_left_out(hc, cfg)
            if grid:
                print(
                    f"perfsweep: this config defines a grid in hydra.sweeper.params ({grid}), which only -m "
                    f"runs; running one job with {taken}",
                    file=sys.stderr,
                )
    except BaseException as exc:  # a refusal, or a stop (Ctrl-C, SIGTERM, SIGHUP) before the run's row
        if not multirun and (claim is None or not claim.kept):
            if claim is not None:
                claim.release()
            preflight.remove_refused_run_folder(Path(sweep_dir))  # only Hydra's own files: no trace left
        if not isinstance(exc, ConfigError | UserError):  # UserError: a path SQLAlchemy cannot name
            raise
        print(f"perfsweep: {store.hide_password(str(exc))}; {preflight.NO_JOB}", file=sys.stderr)
        sys.exit(2)
    spec = launcher.JobSpec(
        cfg=run_cfg,
        job_dir=Path(hc.runtime.output_dir),
        launch_dir=launch_dir,
        sweep_dir=sweep_dir,
        sweep_name=run_cfg.name or hc.job.config_name or "perfsweep",
        overrides=[o for o in hc.overrides.task if not o.startswith(NOT_OVERRIDES)],
        job_num=hc.job.num if multirun else 0,
        command=command,
        env={str(k): str(v) for k, v in (hc.job.env_set or {}).items()},
    )
    if multirun:
        return launcher.launch(spec)
    url = launcher.db_url(run_cfg, launch_dir)
    assert sweep_id is not None  # reserved above for a single run
    try:
        with interrupts.unmasked(), launcher.SweepHeartbeat(url, sweep_id):
            run_id, status = launcher.run_until_output_closed(spec)
    except KeyboardInterrupt as exc:
        with interrupts.held(interrupts.STOPPING_NOTE):
            # the run may have finished as the signal came (its result is kept): then it is not to be run again
            try:
                statuses: list[str] | None = summary.run_statuses(url, sweep_id)
            except Exception:  # noqa: BLE001 - the database went away: the run is not known to be stored
                statuses = None
            # finished, but refused by the database: its row reads running (or there is none)
            kept = importer.kept_runs(importer.kept_of_sweep(url, sweep_dir)) if statuses != ["ok"] else []
            finished = statuses == ["ok"] or any(r.get("status") in FINAL_STATUSES for r in kept)
            if finished and kept and (on_disk := importer.kept_hint(url, sweep_dir)):
                exc.perfsweep_hint = on_disk
            elif finished:
                exc.perfsweep_hint = (
                    f"the run finished and is stored; see it with: {summary.report_command(url, sweep_id)}"
                )
            elif statuses == []:  # stopped before its row was written: nothing of it is stored
                exc.perfsweep_hint = "the run had not started; run the command again to measure it"
            else:
                exc.perfsweep_hint = "the run is stored as interrupted; run the command again to measure it"
            if not summary.close_sweep(url, sweep_dir, "done" if finished else "interrupted") and finished:
                exc.perfsweep_hint = summary.unclosed_hint(url, sweep_id, after_import=bool(kept))  # close it first
        if not interrupts.repeated():  # a second Ctrl-C: the user wants out, not a table
            summary.show_sweep(url, sweep_dir, make_report=False, unsaved=kept)
        raise
    # the run is stored: only the summary (or report) is missing, or an import of what is kept
    with summary.hint_stored(url, sweep_id, lambda: importer.kept_hint(url, sweep_dir)):
        closed = summary.close_sweep(url, sweep_dir, "done")
        kept = importer.kept_of_sweep(url, sweep_dir) if run_id is None else []  # the database refused it
        summary.show_sweep(url, sweep_dir, make_report=run_cfg.report, unsaved=importer.kept_runs(kept))
    not_ok = run_id is not None and status not in EXIT_0_STATUSES and not run_cfg.allow_failures
    if not_ok:  # what went wrong, then what to type: the import, the close
        print(
            f"perfsweep: {launcher.not_ok_line([status])}; exit code 1 (allow_failures=true exits 0)", file=sys.stderr
        )
    if run_id is None:
        where = (
            f"is kept in {kept[0]}; import with: {importer.import_command(url, sweep_dir, kept)}"
            if kept
            else "could not be kept on disk either (see above)"
        )
        print(f"perfsweep: the result could not be written to {store.hide_password(url)} and {where}", file=sys.stderr)
    if not closed:
        print(summary.unclosed_line(url, sweep_id, after_import=bool(kept)), file=sys.stderr)
    if run_id is None or not_ok or not closed:
        sys.exit(1)
    return status


SUBCOMMANDS = {
    "report": "perfsweep.report.__main__",  # build reports from the database
    "trace": "perfsweep.trace",  # read a torch.profiler Chrome trace
    "query": "perfsweep.query",  # one read-only SQL query
    "upgrade": "perfsweep.upgrade",  # bring an older database to the current schema
    "import": "perfsweep.importer",  # store results a job kept on disk when the database refused
    "resume": "perfsweep.resume",  # rerun the grid points of a sweep that have no ok run
}


def _subcommand(name: str, argv: list[str]) -> int:
    """Run ``perfsweep NAME ...``; output piped into ``head`` that stops reading ends it quietly, a
    path it cannot look at in one line (exit 2), and Ctrl-C in one line, exit 130, as a stopped sweep
    ends (a report's files are replaced whole or not at all: perfsweep.report.build.publishing)."""
    import importlib

    # SIGTERM keeps its default, to end the command at once: a handler of Python's runs only between
    # bytecodes, and `kill` waited for a query or a long draw to finish (a report's files are
    # renamed into place under interrupts.held, which holds SIGTERM too)
    try:
        return importlib.import_module(SUBCOMMANDS[name]).main(argv)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 1
    except OSError as exc:
        # a path the commands could not even look at (a folder this user may not enter, a name over
        # 255 bytes): each command answers the paths it expects to be wrong; these were a traceback
        if exc.filename is None:
            raise
        print(f"perfsweep {name}: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one would only cut this line short
        print(f"perfsweep {name}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def _multirun_first(argv: list[str]) -> list[str]:
    """``-m`` (``--multirun``) moved before the overrides: Hydra's parser takes it only there, and
    ``perfsweep device=cpu -m amp=true,false`` printed its whole usage text and "unrecognized
    arguments: amp=true,false". The flag takes no value, so nothing else changes place."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return [*flags[:1], *(a for a in argv if a not in ("-m", "--multirun"))] if flags else argv


def _refuse_cfg_with_multirun(argv: list[str]) -> None:
    """Hydra answers ``-m --cfg job`` with a traceback; a sweep has many configs, --cfg shows one."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(argv)
    if args.multirun and (args.cfg or args.info):
        flag = "--cfg" if args.cfg else "--info"
        print(
            f"perfsweep: -m cannot be combined with {flag} (a sweep has one config per grid point); "
            f"drop -m and give one value per key to see that grid point's config",
            file=sys.stderr,
        )
        sys.exit(2)


def _refuse_unclear_overrides(argv: list[str]) -> None:
    """The overrides Hydra would run as something other than what was typed
    (:func:`perfsweep.preflight.override_problem`), refused before anything starts."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(argv)
    if problem := preflight.override_problem(args.overrides):
        print(f"perfsweep: {store.hide_password(problem)}; {preflight.NO_JOB}", file=sys.stderr)  # echoes overrides
        sys.exit(2)


RUN_JOB = ("hydra.core.utils", "run_job")
"""Where Hydra makes a job's folder and writes its files there, before calling the task function."""


def unwritable_run_folder(exc: BaseException) -> str | None:
    """The line for a plain run whose folder Hydra could not create or write (no permission, a
    full disk), which it does before any perfsweep code runs; None for any other error. A sweep
    (-m) checks its folder itself (perfsweep.preflight.claim_folder)."""
    import traceback

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return None

    # Hydra has reset its config by now; its run_job frame still holds the folder it was making
    frames = traceback.walk_tb(exc.__traceback__)
    made = [f.f_locals for f, _ in frames if (f.f_globals.get("__name__"), f.f_code.co_name) == RUN_JOB]
    if _task_started or not made or made[-1]["config"].hydra.mode != RunMode.RUN:
        return None
    folder = Path(made[-1]["output_dir"]).absolute()
    preflight.remove_refused_run_folder(folder)  # what Hydra made of it before it failed
    return (
        f"cannot write the run's folder {folder} ({cause.strerror or cause}: {cause.filename}); free space or "
        "permission there, or set hydra.run.dir to another place"
    )


def main() -> None:
    """``perfsweep report|trace|query|upgrade|import|resume ...`` run those commands; anything else is a sweep."""
    if os.environ.get(STACKS_ENV) == "1":  # a command that seems stuck: `kill -USR1 PID` shows where it waits
        import faulthandler

        faulthandler.register(signal.SIGUSR1, all_threads=True)
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        sys.exit(_subcommand(sys.argv[1], sys.argv[2:]))
    if sys.argv[1:] == ["--version"]:  # Hydra's own flag would print Hydra's version only
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"perfsweep {version('perfsweep')} (Hydra {version('hydra-core')})")
        except PackageNotFoundError:
            print("perfsweep (not installed: run from a source tree)")
        sys.exit(0)
    if len(sys.argv) > 1 and not sys.argv[1].startswith(("-", "~", "+")) and "=" not in sys.argv[1]:
        # a bare word first is no Hydra override (key=value, +key=value, ~key): a mistyped command
        import difflib

        like = difflib.get_close_matches(sys.argv[1], SUBCOMMANDS, n=1)
        print(
            f"perfsweep: unknown command {sys.argv[1]!r}"
            + (f"; did you mean {like[0]!r}?" if like else "")
            + f" (commands: {', '.join(SUBCOMMANDS)}; a sweep takes key=value overrides)",
            file=sys.stderr,
        )
        sys.exit(2)
    sys.argv[1:] = _multirun_first(sys.argv[1:])
    _refuse_cfg_with_multirun(sys.argv[1:])
    _refuse_unclear_overrides(sys.argv[1:])
    if os.getcwd() not in sys.path and "" not in sys.path:
        # `python -m perfsweep` imports from the launch directory; the `perfsweep` console script
        # must too, so a model._target_ next to the user's config resolves either way (jobs inherit it)
        sys.path.insert(0, os.getcwd())
    # Let Hydra's composition errors reach us as exceptions (instead of its multi-line report)
    # so that they are answered in one line like every other mistake; HYDRA_FULL_ERROR=1 set by
    # the user still shows the whole traceback.
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"
    interrupts.install()
    try:
        with interrupts.unmasked():  # a Ctrl-C inside Hydra's own code may surface as another error
            hydra_main()
    except preflight.COMPOSE_ERRORS as exc:
        if full_error:
            raise
        # Hydra's errors echo the override as typed: db.ur=postgresql://u:pw@h/db, a '#' in a password
        print(f"perfsweep: {store.hide_password(preflight.error_line(exc))}; {preflight.NO_JOB}", file=sys.stderr)
        sys.exit(2)
    except (OSError, ValueError) as exc:  # ValueError: logging's, when it cannot open the run's log file
        if full_error or (line := unwritable_run_folder(exc)) is None:
            raise
        print(f"perfsweep: {store.hide_password(line)}; {preflight.NO_JOB}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as exc:
        # Everything is stored by now (a Ctrl-C during the bookkeeping was held until it was done):
        # one more would only cut this last line short and end the process by the signal.
        for sig in interrupts.HELD_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        # a plain run stopped before hydra_main could hand its folder back: what Hydra made goes
        if not _folder_watched:
            preflight.remove_refused_run_folder()
        # The sweeper has printed the summary of the jobs that finished; they are stored.
        how = interrupts.how_stopped(exc)  # what stopped it first
        # what to do next, set where it is known: the sweeper (resume), the summary (the report), a plain run
        hint = interrupts.hint_of(exc) or "before any job started"
        with contextlib.suppress(OSError):  # a closed pipe or terminal: nobody reads it, the exit code says it
            print(f"perfsweep: {how}{' ' if hint.startswith('before') else '; '}{hint}", file=sys.stderr)
        sys.exit(interrupts.exit_code(exc))


def cli() -> None:
    """The ``perfsweep`` console script and ``python -m perfsweep``: :func:`main`, then an exit
    without the interpreter's teardown of torch, pandas and matplotlib, which added 0.3 s to a sweep
    and 0.1 s to a query (the exit handlers still run: perfsweep.job_entry.exit_now). An uncaught exception
    still ends the normal way, with its traceback."""
    answered = False
    try:
        try:
            main()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:  # sys.exit("message"), as Python prints it
                print(exc.code, file=sys.stderr)
                code = 1
        answered = True
        # the last line is out and everything is stored: a Ctrl-C in the teardown has nothing left to
        # stop, and raised there it printed "Exception ignored ... KeyboardInterrupt" after that line
        for sig in interrupts.HELD_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    except KeyboardInterrupt as exc:
        # one that came after every handler in main() (as a command returned, "Report: ..." printed,
        # or on these very lines) was a traceback under the command's last line
        for sig in interrupts.HELD_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if not answered:
            with contextlib.suppress(OSError):
                print(f"perfsweep: {interrupts.how_stopped(exc)}", file=sys.stderr)
            code = interrupts.exit_code(exc)
    import multiprocessing

    from perfsweep import job_entry

    # no collection where no child process is alive (a DataLoader's workers): 0.13 s with torch imported
    job_entry.exit_now(code, collect=bool(multiprocessing.active_children()))


if __name__ == "__main__":
    cli()
