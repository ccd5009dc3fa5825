"""perfsweep's Hydra sweeper: Hydra's basic grid sweeper plus what a benchmark needs.

1. Every grid point is composed and checked (perfsweep.preflight: values, device, data, a
   database write) before the first job starts, so a mistake stops the sweep with one line
   and exit code 2 instead of failing job 7 of 8.
2. ``repeat=N`` runs every grid point N times in rounds (perfsweep.schedule); jobs learn the
   sweep's size, start time and id and their repeat through ``sweep.*`` overrides; with
   ``resume=true`` only the grid points without an ``ok`` run are launched, keeping their
   numbers and folders.
3. When all jobs are done, ok or not, the summary table and the report are produced from the
   database. Hydra's on_multirun_end callback is skipped when a job fails; this is not.
4. The exit code says whether every job finished ok and was stored: 1 if not (after the
   summary), unless ``allow_failures=true``; a result the database refused is named with the
   ``perfsweep import`` command that stores it later.
"""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# before it is in sys.modules, and dataclasses cannot resolve string annotations then.
import contextlib
import logging
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

log = logging.getLogger(__name__)


_PACE_SAMPLE = 10
"""Grid points composed before a large grid's time is estimated from their pace."""


@dataclass
class PerfsweepSweeperConf:
    _target_: str = "hydra_plugins.perfsweep_sweeper.PerfsweepSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


ConfigStore.instance().store(group="hydra/sweeper", name="perfsweep", node=PerfsweepSweeperConf)


class PerfsweepSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        from perfsweep import preflight
        from perfsweep.cli import seconds_text
        from perfsweep.config import ConfigError, Order, to_plain_dict, to_run_config
        from perfsweep.names import LARGE_GRID_POINTS

        assert self.hydra_context is not None and self.config is not None and self.launcher is not None
        params = self._parse_config() + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = [job for batch in self.split_arguments(parser.parse_overrides(params), None) for job in batch]
        if not jobs:  # e.g. batch='range(4,0)'
            _refuse(f"the grid is empty: no grid point in {' '.join(arguments) or '(no overrides)'}; check its ranges")
        run_cfgs = []
        started = time.perf_counter()
        for i, job in enumerate(jobs):
            if i == _PACE_SAMPLE and len(jobs) >= LARGE_GRID_POINTS:  # a long silence otherwise
                pace = (time.perf_counter() - started) / i
                print(
                    f"perfsweep: checking {len(jobs):,} grid points before any job starts; composing them "
                    f"takes ~{seconds_text(pace * len(jobs))} at this machine's pace",
                    file=sys.stderr,
                    flush=True,
                )
            try:
                job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job))
                run_cfgs.append(to_run_config(OmegaConf.masked_copy(job_cfg, [k for k in job_cfg if k != "hydra"])))
            except preflight.COMPOSE_ERRORS as exc:
                _refuse(f"{preflight.error_line(exc)} [grid point {i + 1}/{len(jobs)}: {' '.join(job)}]")
        from perfsweep import job_start

        if type(self.launcher).__name__ == "BasicLauncher":  # the jobs start in this process
            env_set = OmegaConf.to_container(self.config.hydra.job.env_set, resolve=False)  # per job: ${hydra:job.num}
            job_start.start_early(run_cfgs, {str(k): str(v) for k, v in env_set.items()})  # imports while we do
        from perfsweep import importer, interrupts, launcher, schedule, search, store, summary  # torch, once composed
        from perfsweep.cli import UserError, first_line, hide_db_url
        from perfsweep.names import EXIT_0_STATUSES, MULTI_HOST_LAUNCHERS

        first = run_cfgs[0]
        hydra_launcher = type(self.launcher).__name__
        here = hydra_launcher not in MULTI_HOST_LAUNCHERS  # do the jobs run on this machine?
        # db.url too: the sweep's row is in one database, and a job writing to another failed its write
        for key in ("repeat", "order", "report", "launcher.parallel", "launcher.gpus_per_job", "db.url"):
            typed = (str(_get(c, key)) for c in run_cfgs)
            # as typed, not sorted; true and True alike, but not two paths that differ in case
            values = list(dict.fromkeys(typed if key == "db.url" else (v.lower() for v in typed)))
            if len(values) > 1:
                shown = ",".join(map(hide_db_url, values) if key == "db.url" else values)
                _refuse(f"invalid config: {key}={shown}: must be one value for the whole sweep, not a grid axis")
        try:  # what needs no torch first (preflight.check_all); a batch=max point at batch 1, where it may start
            typed_url = launcher.db_url(first, self.config.hydra.runtime.cwd)
            preflight.check_db_url(typed_url)  # before torch is asked for a GPU
            preflight.check_db_for_hosts(typed_url, hydra_launcher)
            if hasattr(self.launcher, "params"):  # submitit's launchers: the allocation's GPUs
                _check_gpus_per_job(self.launcher.params, run_cfgs)
            data_notes = preflight.data_keys_read(list(zip([list(j) for j in jobs], run_cfgs, strict=True)))
            checked = [_at_batch_1(c) if search.is_search(c) else c for c in run_cfgs]
            placements = preflight.check_all(checked, jobs_run_here=here, hydra_launcher=hydra_launcher)
        except (ConfigError, UserError) as exc:  # UserError: a database path SQLAlchemy cannot name (store.sqlite_url)
            _refuse(str(exc))
        for note in data_notes:
            print(note, file=sys.stderr)
        launch_dir = Path(self.config.hydra.runtime.cwd).resolve()
        sweep_dir = Path(self.config.hydra.sweep.dir).resolve()
        url = launcher.db_url(first, launch_dir)
        hashes = [launcher.config_hash(to_plain_dict(c)) for c in run_cfgs]
        order = schedule.plan(len(jobs), first.repeat, first.order == Order.shuffle, first.seed)
        claim = None
        try:  # until the sweep's row is written, any way out hands the folder back (preflight.Claim)
            with interrupts.held():  # a stop as the folder is claimed comes once it is, and is handed back
                claim = preflight.claim_folder(sweep_dir, "hydra.sweep.dir", first.resume, launch_dir)
            if first.resume:
                grid = [(p, hashes[i]) for p, (i, _) in enumerate(order)]
                searched = {p for p, (i, _) in enumerate(order) if search.is_search(run_cfgs[i])}
                try:
                    done = preflight.resume_points(url, str(sweep_dir), grid, searched)
                except ConfigError as exc:
                    _refuse(str(exc))
                if imported := _store_kept(url, sweep_dir):  # a finished point is not run again
                    done = preflight.resume_points(url, str(sweep_dir), grid, searched)
                    print(f"perfsweep: {importer.stored_line(imported)}", file=sys.stderr)
                todo = [p for p, (i, _) in enumerate(order) if (p, hashes[i]) not in done]
                print(
                    f"perfsweep: resuming the sweep in {sweep_dir}: {len(order) - len(todo)} of {len(order)} "
                    f"jobs already ok, {len(todo)} to run",
                    file=sys.stderr,
                )
                if not todo:  # nothing to run: a closed sweep, its times and its report stay as they are
                    late = summary.close_late(url, str(sweep_dir))  # its end, if the database refused it before
                    if late is not None:
                        if late[1]:
                            print(
                                "perfsweep: stored the sweep's end and closing figures, missing until now",
                                file=sys.stderr,
                            )
                        summary.show_sweep(url, str(sweep_dir), first.report, swept=_swept_keys(jobs))
                        if not late[1]:
                            print(summary.unclosed_line(url, late[0]), file=sys.stderr)
                            sys.exit(1)
                    elif imported:  # its summary and report were drawn without them
                        summary.show_sweep(url, str(sweep_dir), first.report, swept=_swept_keys(jobs))
                    elif first.report and not (sweep_dir / "report" / "report.md").exists():
                        print(
                            f"perfsweep: the sweep has no report yet; build it with: {summary.report_command(url, sweep_dir)}"
                        )
                    return []
            else:
                todo = list(range(len(order)))
            # a CPU's matmul peak is measured where the jobs run; on other hosts it is not this machine's
            job_cpus = len(placements[0].cpus) if placements[0].cpus else None
            sweep_id, cpu = preflight.reserve_sweep(
                url,
                str(sweep_dir),
                first.name or self.config.hydra.job.config_name or "perfsweep",
                claim,
                command=store.typed_command(),
                n_jobs=len(order),
                hostname=socket.gethostname(),
                launch_dir=str(launch_dir),
                parallel=preflight.at_once(self.config.hydra.launcher, hydra_launcher, len(todo), placements),
                hydra_launcher=hydra_launcher,
                measure=(lambda: preflight.cpu_sweep_fields(run_cfgs, job_cpus)) if here else dict,
            )
        except BaseException as exc:
            if claim is not None:
                claim.release()
            if isinstance(exc, ConfigError):
                _refuse(str(exc))
            raise
        unread: list[BaseException] = []  # the pipe or terminal gone while the sweep's row is running

        def say(line: str) -> None:
            """A line of the sweep's own once its row is written: a closed pipe or terminal is kept,
            and raised inside the ``try`` below, which stores the sweep interrupted (its row was
            left ``running`` when the plan line found the pipe closed)."""
            try:
                print(line, file=sys.stderr)
            except OSError as exc:
                if not interrupts.output_gone(exc):
                    raise
                unread.append(interrupts.output_closed(exc))

        to_run = [run_cfgs[order[p][0]] for p in todo]  # a resume's notices are of the jobs left
        for notice in preflight.start_notices(cpu, to_run, placements if here else []):
            say(notice)
        searches = [p for p, c in zip(todo, to_run, strict=True) if search.is_search(c)]
        # the sweep's size, start and id and each job's repeat reach the job through its config
        # (perfsweep.config.SweepContext); a job's number is its place in the plan
        context = [f"sweep.n_jobs={len(order)}", f"sweep.started_at={time.time()}", f"sweep.id={sweep_id}"]
        context.append(f"sweep.searches={len(searches)}")
        jobs = [[*jobs[i], *context, f"sweep.repeat_index={r}", f"sweep.grid_index={i}"] for i, r in order]
        if hasattr(self.launcher, "params") and "timeout_min" in self.launcher.params:  # submitit's launchers
            _fit_time_limit(self.launcher.params, run_cfgs, list(self.config.hydra.overrides.hydra))
        if hasattr(self.launcher, "params") and store.hide_password(url) != url:
            # each job is given its config, the URL with it, in submitit's pickles: hidden there, no job could write
            say(
                f"perfsweep: db.url's password goes into submitit's job files under "
                f"{self.launcher.params.get('submitit_folder', 'hydra.launcher.submitit_folder')} (each job needs "
                "it to store its result); to keep it out of files, give it by ~/.pgpass or PGPASSWORD instead"
            )
        at_once = f", {len(placements)} at a time" if len(placements) > 1 else ""
        say(f"perfsweep: {_plan(len(todo), len(searches))}{at_once}; job folders under {sweep_dir}")
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        preflight.hide_passwords_in_files(sweep_dir / "multirun.yaml")  # as Hydra's files in each job's folder
        returns: list[Any] = []
        search_statuses: list[str] = []
        next_num = [len(order)]  # a search's first try keeps its place in the plan; later tries come after

        def launch_one(overrides: list[str], first_num: list[int]) -> str:
            num = first_num.pop() if first_num else next_num[0]
            if num >= len(order):
                next_num[0] += 1
            done = self.launcher.launch([[*overrides, f"sweep.n_jobs={max(len(order), num + 1)}"]], initial_job_idx=num)
            return _status(done[0])

        # a resumed sweep's earlier rows (failed, timed out) are not this launch's outcomes
        since_id = _last_run_id(url, sweep_id) if first.resume else 0
        end = "interrupted"
        closed = False  # whether the sweep's end and closing figures were written
        interrupt: KeyboardInterrupt | None = None
        lost: list[int] = []  # job numbers whose returns the launcher could not give
        # perfsweep's slots: several at once, or one that narrows the GPUs a job sees (gpus_per_job)
        slotted = hydra_launcher == "BasicLauncher" and (len(placements) > 1 or placements[0].gpus is not None)
        if slotted:
            launcher.start_concurrent(placements)
        try:
            with interrupts.unmasked(), launcher.SweepHeartbeat(url, sweep_id):
                if unread:
                    raise unread[0]
                # no validate_batch_is_legal: it composes every job once more (about 75 ms each on a
                # 2-core VM) to catch what composing every grid point above has caught already; what
                # is added since, the sweep.* context, is perfsweep's own and valid
                for start, batch in _contiguous([p for p in todo if p not in searches], jobs):
                    try:
                        returns.append(self.launcher.launch(batch, initial_job_idx=start))
                    except Exception as exc:
                        if hydra_launcher == "BasicLauncher" or interrupts.hides_signal(exc):
                            raise  # a Ctrl-C that another launcher's error hides: unwound as one (unmasked)
                        # e.g. submitit's UncompletedJobError for a job the scheduler killed outright:
                        # the other jobs' rows are stored, and this one's row says what is known
                        print(
                            f"perfsweep: {hydra_launcher} lost track of jobs {start + 1}-{start + len(batch)} "
                            f"({first_line(exc, 200)}); their statuses are read from the database",
                            file=sys.stderr,
                        )
                        lost.extend(range(start, start + len(batch)))
                if slotted:
                    launcher.wait_concurrent()
                if searches:
                    engine = store.connect(url)
                    try:
                        for p in searches:
                            i, first_num = order[p][0], [p]
                            point = [o for o in jobs[p] if not o.startswith("sweep.n_jobs=")]
                            outcome = search.run(
                                engine, sweep_id, i, point, run_cfgs[i], lambda o, f=first_num: launch_one(o, f)
                            )
                            search_statuses.append(outcome.exit_status)
                    finally:
                        engine.dispose()
            end = "done"
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (perfsweep.__main__ prints this after the summary)
            interrupt = exc
            # held, the hint set inside: a second stop is delivered as the hold ends, and raised
            # before the hint was set it lost the line ("interrupted before any job started")
            with interrupts.held(interrupts.STOPPING_NOTE):
                finished = None if searches else _finished_count(url, sweep_id, len(order), todo, since_id)
                # finished, but refused by the database: read as unfinished there ("no job had finished")
                kept = [] if finished is None else importer.kept_of_sweep_if_known(url, str(sweep_dir)) or []
                gone = finished is not None and _sweep_gone(url, sweep_id, sweep_dir)
                exc.perfsweep_hint, all_done = _stopped_hint(
                    url, sweep_id, sweep_dir, len(order), todo, None if gone else finished, kept
                )
                if all_done:  # it came as the last job's process exited: nothing is left to resume
                    end = "done"
            raise
        finally:
            # after Ctrl-C or SIGTERM: the jobs still running are stopped and stored, and the sweep is
            # closed with its figures, even if a second one comes (it is held, then skips the summary)
            try:
                # all is stored: only the summary (or report) is missing, or an import of what is kept
                with summary.hint_stored(url, sweep_id, lambda: importer.kept_hint(url, str(sweep_dir))):
                    with interrupts.held(interrupts.STOPPING_NOTE if end != "done" else None):
                        launcher.end_concurrent()
                        closed = summary.close_sweep(url, str(sweep_dir), end)
                    if interrupt is not None and end == "done" and not closed:  # not "see them": close it first
                        interrupt.perfsweep_hint = summary.unclosed_hint(url, sweep_id, after_import=bool(kept))
                    if not interrupts.repeated():  # a second Ctrl-C: the user wants out, not a table
                        kept = importer.kept_runs(importer.kept_of_sweep(url, str(sweep_dir)))
                        summary.show_sweep(url, str(sweep_dir), first.report, kept, swept=_swept_keys(jobs))
            except Exception as exc:  # noqa: BLE001 - never hide the jobs' own outcome
                with contextlib.suppress(OSError):  # where the output itself is gone, the exit code says it
                    print(
                        f"perfsweep: could not print the summary from {store.hide_password(url)}: {exc}",
                        file=sys.stderr,
                    )
        statuses = [_status(r) for batch in returns for r in batch] + search_statuses
        statuses += _stored_statuses(url, sweep_id, lost)
        # what went wrong, then what to type: the jobs that did not finish ok, the import, the close
        not_ok = any(s not in EXIT_0_STATUSES for s in statuses) and not first.allow_failures
        if not_ok:
            print(
                f"perfsweep: {launcher.not_ok_line(statuses)}; exit code 1 (allow_failures=true exits 0)",
                file=sys.stderr,
            )
        unsaved = importer.kept_of_sweep(url, str(sweep_dir))
        if unsaved:
            print(
                f"perfsweep: {len(unsaved)} result{'s' if len(unsaved) != 1 else ''} could not be written to "
                f"{store.hide_password(url)} and {'are' if len(unsaved) != 1 else 'is'} kept as result.json; "
                f"import with: {importer.import_command(url, sweep_dir, unsaved)}",
                file=sys.stderr,
            )
        if not closed:  # last: an import redraws the figures, but only resume --close closes
            print(summary.unclosed_line(url, sweep_id, after_import=bool(unsaved)), file=sys.stderr)
        if unsaved or not_ok or not closed:
            sys.exit(1)
        return returns


def _swept_keys(jobs: list[list[str]]) -> list[str]:
    """The override keys whose values differ between the grid's points (``amp``, ``model.width``),
    in the order they were given: the axes the sweep's summary names its configs by."""
    values: dict[str, set[str]] = {}
    for job in jobs:
        for override in job:
            key, _, value = override.partition("=")
            values.setdefault(key.lstrip("+~"), set()).add(value)
    return [k for k, v in values.items() if len(v) > 1 and not k.startswith(("sweep.", "hydra."))]


def _get(cfg: Any, dotted: str) -> Any:
    """``cfg``'s value at a dotted key, an enum as its value."""
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return getattr(value, "value", value)


SUBMITIT_DEFAULT_TIMEOUT_MIN = 60
"""hydra-submitit-launcher's own ``timeout_min`` (its BaseQueueConf): a value other than this one
was set by the user, in a launcher yaml or on the command line."""


def _stored_statuses(url: str, sweep_id: int, job_nums: list[int]) -> list[str]:
    """The statuses the database holds for jobs whose returns were lost (a job the scheduler killed
    outright makes submitit's launcher raise for the whole batch): a row still ``running`` (its
    process gone) or missing counts as ``interrupted``."""
    if not job_nums:
        return []
    from sqlalchemy import select

    from perfsweep import store

    rows = _read_rows(
        url,
        select(store.Run.job_num, store.Run.status)
        .where(store.Run.sweep_id == sweep_id, store.Run.job_num.in_(job_nums))
        .order_by(store.Run.id),  # a resumed grid point's latest row last
    )
    latest = {num: status for num, status in rows}
    return [latest.get(n, "running").replace("running", "interrupted") for n in job_nums]


def _read_rows(url: str, statement: Any) -> list[Any]:
    """The rows of ``statement`` read from ``url`` read-only (a file gone is not made again)."""
    from perfsweep import store

    engine = store.connect_read_only(url)
    try:
        with store.session(engine) as s:
            return list(s.execute(statement).all())
    finally:
        engine.dispose()


def _last_run_id(url: str, sweep_id: int) -> int:
    """The newest run row of the sweep (0 for none): what a resume finds before it starts."""
    from sqlalchemy import func, select

    from perfsweep import store

    try:
        ((last,),) = _read_rows(url, select(func.max(store.Run.id)).where(store.Run.sweep_id == sweep_id))
    except Exception as exc:  # noqa: BLE001 - only the line after a Ctrl-C counts on it; the jobs do not
        log.debug("could not read the sweep's last run: %s", exc)
        return 0
    return last or 0


def _stopped_hint(
    url: str,
    sweep_id: int,
    sweep_dir: Path,
    n_jobs: int,
    todo: list[int],
    finished: int | None,
    kept: list[Path],
) -> tuple[str, bool]:
    """The last line's advice after a stop, and whether every job had finished. ``finished``: the
    grid points finished and stored (:func:`_finished_count`; None when not known, or when the
    database no longer holds the sweep, :func:`_sweep_gone`, whose resume it refused); ``kept``: the
    result files the database refused (perfsweep.importer.kept_of_sweep), whose points read as
    unfinished in it, so the line said "no job had finished" under a summary showing them
    ``unsaved``. A resume stores them first; the import stores them without running anything."""
    from perfsweep import importer, store, summary
    from perfsweep.names import FINAL_STATUSES

    resume = f"perfsweep resume {sweep_id} --db {summary.db_arg(url)}"
    if finished is None and kept:  # the database lost the sweep (its file replaced): resume cannot find it
        them = "them" if len(kept) != 1 else "it"
        rest = (
            ""
            if len(kept) == n_jobs
            else f", then run the rest with: perfsweep resume N --db {summary.db_arg(url)}, N the sweep it names"
        )
        return (
            f"the database no longer holds the sweep ({store.gone_cause(url)}); {len(kept)} finished "
            f"result{'s are' if len(kept) != 1 else ' is'} kept as result.json; store {them} with: "
            f"{importer.import_command(url, sweep_dir, kept)}{rest}",
            False,
        )
    if finished is None:  # a search's tries, or a database that cannot say: what is stored is kept
        return f"finished jobs are in the database; run the rest with: {resume}", False
    kept_points = {
        r["job_num"] for r in importer.kept_runs(kept) if r.get("job_num") in todo and r.get("status") in FINAL_STATUSES
    }
    done = finished + len(kept_points)
    if kept_points:
        them = "them" if len(kept_points) != 1 else "it"
        how = "kept as result.json, which the database refused"
        how = f"{len(kept_points)} of them {how}" if done > len(kept_points) else how
        if done == n_jobs:
            what = "every job" if n_jobs != 1 else "the job"
            store_them = importer.import_command(url, sweep_dir, kept)
            return f"{what} had finished, {how}; store {them} with: {store_them}", True
        return f"{done} of {n_jobs} jobs finished, {how}; store {them} and run the rest with: {resume}", False
    if done == n_jobs:
        return f"every job had finished and is stored; see them with: {summary.report_command(url, sweep_id)}", True
    if done == 0:  # "finished jobs are in the database" read as if some were
        return f"no job had finished; run them with: {resume}", False
    return f"{done} of {n_jobs} jobs finished and are stored; run the rest with: {resume}", False


def _sweep_gone(url: str, sweep_id: int, sweep_dir: Path) -> bool:
    """Whether the database no longer holds the sweep (a SQLite file deleted or replaced while it
    ran): its counts are another sweep's or none, and a resume by its id is refused."""
    from sqlalchemy import select

    from perfsweep import store

    try:
        found = _read_rows(url, select(store.Sweep.sweep_dir).where(store.Sweep.id == sweep_id))
    except Exception:  # noqa: BLE001 - it cannot say: the line says what it knows
        return False
    return not found or found[0][0] != str(sweep_dir)


def _finished_count(url: str, sweep_id: int, n_jobs: int, todo: list[int], since_id: int) -> int | None:
    """How many of the sweep's ``n_jobs`` grid points are finished, for the line after a Ctrl-C:
    those this launch did not run (a resume's points already ok), and those of ``todo`` whose
    latest run is newer than ``since_id`` and has a final status (``ok``, ``oom``, ...). All of
    them leave nothing to resume. A resumed point's earlier failure is no outcome of this launch:
    counted, a Ctrl-C as the resume began said every job had finished, and closed the sweep done.
    None when the database cannot say."""
    from sqlalchemy import select

    from perfsweep import store
    from perfsweep.names import FINAL_STATUSES

    try:
        rows = _read_rows(
            url,
            select(store.Run.job_num, store.Run.id, store.Run.status)
            .where(store.Run.sweep_id == sweep_id, store.Run.job_num.in_(todo))
            .order_by(store.Run.id),  # a point's latest row last
        )
    except Exception:  # noqa: BLE001 - the database went away: the jobs are not known to be stored
        return None
    latest = {num: (run_id, status) for num, run_id, status in rows}
    done_here = sum(1 for run_id, status in latest.values() if run_id > since_id and status in FINAL_STATUSES)
    return n_jobs - len(todo) + done_here


def _check_gpus_per_job(params: dict[str, Any], cfgs: list[Any]) -> None:
    """A data-parallel job on the cluster needs a GPU per rank in its allocation; refused here
    rather than after it queued and failed at ``cuda:1`` on the node."""
    from perfsweep.config import ConfigError, Device

    nproc = (
        max((c.nproc or 0) for c in cfgs if c.device != Device.cpu) if any(c.device != Device.cpu for c in cfgs) else 0
    )
    per_node = params.get("gpus_per_node")
    per_task = params.get("gpus_per_task")
    gpus = per_node if per_node is not None else per_task
    if nproc > 1 and gpus is not None and gpus < nproc:
        key = "gpus_per_node" if per_node is not None else "gpus_per_task"
        raise ConfigError(
            f"invalid config: hydra.launcher.{key}={gpus}: a job of nproc={nproc} drives a GPU per rank; "
            f"set hydra.launcher.{key}={nproc} (or device=cpu)"
        )


def _fit_time_limit(params: dict[str, Any], cfgs: list[Any], hydra_overrides: list[str]) -> None:
    """submitit's ``timeout_min`` (SLURM's time limit), derived from ``timeout_s`` unless the user
    set it (on the command line, or in a launcher yaml to anything but submitit's default 60): a job may take ``timeout_s`` to start and ``timeout_s`` to train, plus a margin for
    its data and its result (perfsweep.names.SCHEDULER_TIME_MARGIN_S), so perfsweep's own timeout
    ends a slow job, stored as ``timeout``, before the scheduler kills it. A limit set below that
    is kept, with a warning."""
    import math

    from perfsweep.names import SCHEDULER_TIME_MARGIN_S

    longest = max(c.timeout_s for c in cfgs)
    needed = math.ceil((2 * longest + SCHEDULER_TIME_MARGIN_S) / 60)
    on_command_line = any(o.split("=", 1)[0].lstrip("+~") == "hydra.launcher.timeout_min" for o in hydra_overrides)
    if not on_command_line and params["timeout_min"] == SUBMITIT_DEFAULT_TIMEOUT_MIN:  # not set in a yaml either
        params["timeout_min"] = needed
    elif params["timeout_min"] < needed:
        print(
            f"perfsweep: hydra.launcher.timeout_min={params['timeout_min']} is less than a job may take "
            f"({needed} min: timeout_s={longest:g} to start, as much to train, and "
            f"{SCHEDULER_TIME_MARGIN_S / 60:g} min); the scheduler may end jobs first (stored as interrupted)",
            file=sys.stderr,
        )


def _at_batch_1(cfg: Any) -> Any:
    """``cfg`` with batch 1: what preflight checks of a batch=max grid point."""
    import copy

    at = copy.copy(cfg)
    at.batch = 1
    return at


def _jobs(n: int) -> str:
    return f"{n} job{'s' if n != 1 else ''}"


def _plan(todo: int, searches: int) -> str:
    """``4 jobs, one process each``; a ``batch=max`` search is counted as what it is, since the
    number of jobs it runs (one per batch it tries) is known only as it goes."""
    parts = [_jobs(todo - searches)] if todo > searches else []
    if searches:
        parts.append(f"{searches} batch=max search{'es' if searches > 1 else ''} (a job per batch tried)")
    return f"{' and '.join(parts)}, one process each"


def _store_kept(url: str, sweep_dir: Path) -> list[str]:
    """A resume's first step (perfsweep.importer.store_kept). Refused, before any job, where the
    database still refuses them: the grid points would run again into a database that keeps
    refusing, and a later import would store each of them twice."""
    from perfsweep import importer, store

    try:
        return importer.store_kept(url, str(sweep_dir), "perfsweep")
    except importer.KeptRefused as exc:
        _refuse(
            f"resume=true: the database {store.hide_password(url)} refused a result this sweep kept as result.json "
            f"({exc}); it stays on disk, and the resume stores it first once the database takes writes (a file it "
            "refuses for good: move it out of the sweep's folder, and its grid point runs again)"
        )


def _refuse(message: str) -> NoReturn:
    """Bad input: one line, exit code 2, before any job process exists."""
    print(f"perfsweep: {message}; no job was started", file=sys.stderr)
    sys.exit(2)


def _contiguous(todo: list[int], jobs: list[Any]) -> list[tuple[int, list[Any]]]:
    """Runs of consecutive grid-point numbers, each launched as one batch keeping its numbers."""
    out: list[tuple[int, list[Any]]] = []
    for i in todo:
        if out and out[-1][0] + len(out[-1][1]) == i:
            out[-1][1].append(jobs[i])
        else:
            out.append((i, [jobs[i]]))
    return out


def _status(job_return: Any) -> str:
    """The run status a job returned (perfsweep's task returns it, or with launcher.parallel > 1 a
    Future of it); a job that raised failed."""
    try:
        value = job_return.return_value
        return str(value.result() if hasattr(value, "result") else value)
    except Exception:  # noqa: BLE001 - Hydra re-raises the job's exception here
        return "failed"
