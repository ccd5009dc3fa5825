"""perfsweep's Hydra sweeper: Hydra's basic grid sweeper plus three things a benchmark needs.

1. Every grid point is composed and range-checked before the first job starts, so a bad
   value stops the sweep with one line instead of failing job 7 of 8.
2. Jobs learn the sweep's size and start time (for "3/8" and the time left).
3. When all jobs are done, ok or not, the summary table and the report are produced from the
   database. Hydra's on_multirun_end callback is skipped when a job fails; this is not.
4. The exit code says whether every job finished ok: 1 if not (after the summary), unless
   ``allow_failures=true``.
"""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# before it is in sys.modules, and dataclasses cannot resolve string annotations then.
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf


@dataclass
class PerfsweepSweeperConf:
    _target_: str = "hydra_plugins.perfsweep_sweeper.PerfsweepSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None


ConfigStore.instance().store(group="hydra/sweeper", name="perfsweep", node=PerfsweepSweeperConf)


class PerfsweepSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        from perfsweep import launcher, store, summary
        from perfsweep.config import ConfigError, to_run_config

        assert self.hydra_context is not None and self.config is not None
        params = self._parse_config() + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = [job for batch in self.split_arguments(parser.parse_overrides(params), None) for job in batch]
        run_cfg = None
        for i, job in enumerate(jobs):
            try:
                job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(job))
                run_cfg = to_run_config(OmegaConf.masked_copy(job_cfg, [k for k in job_cfg if k != "hydra"]))
            except (ConfigError, HydraException) as exc:
                print(f"perfsweep: {_one_line(exc)} [grid point {i + 1}/{len(jobs)}: {' '.join(job)}]; no job was started",
                      file=sys.stderr)
                sys.exit(2)
        url = launcher.db_url(run_cfg, self.config.hydra.runtime.cwd) if run_cfg else None
        if url is not None:
            try:  # a wrong db.url or a server that is down stops the sweep before any job runs
                store.connect(url).dispose()
            except Exception as exc:  # noqa: BLE001 - any driver error; its first line says what
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                print(f"perfsweep: cannot open db.url={url!r}: {first}; no job was started", file=sys.stderr)
                sys.exit(2)
        sweep_dir = str(Path(self.config.hydra.sweep.dir).resolve())
        _claim(Path(sweep_dir))
        os.environ[launcher.ENV_N_JOBS] = str(len(jobs))
        os.environ[launcher.ENV_SWEEP_START] = str(time.time())
        n = f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}"
        print(f"perfsweep: {n}, one process each; job folders under {sweep_dir}", file=sys.stderr)
        try:
            returns = super().sweep(arguments)
        finally:
            if url is not None:
                try:
                    summary.finish_sweep(url, sweep_dir)
                except Exception as exc:  # noqa: BLE001 - never hide the jobs' own outcome
                    print(f"perfsweep: could not print the summary from {url}: {exc}", file=sys.stderr)
        statuses = [_status(r) for batch in returns for r in batch]
        if any(s != "ok" for s in statuses) and not (run_cfg is not None and run_cfg.allow_failures):
            print(f"perfsweep: {launcher.not_ok_line(statuses)}; exit code 1 (allow_failures=true exits 0)",
                  file=sys.stderr)
            sys.exit(1)
        return returns


def _status(job_return: Any) -> str:
    """The run status a job returned (perfsweep's task returns it); a job that raised failed."""
    try:
        return str(job_return.return_value)
    except Exception:  # noqa: BLE001 - Hydra re-raises the job's exception here
        return "failed"


def _claim(sweep_dir: Path) -> None:
    """Make ``sweep_dir`` this sweep's own, atomically, or stop before any job starts.

    The sweep folder is the sweep's identity: its rows are keyed by it and its jobs' folders and
    artifacts live in it. The default folder name carries a random part, so concurrent sweeps
    never meet; a folder set by hand (``hydra.sweep.dir=...``) that another sweep already used
    is refused rather than shared.
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    marker = sweep_dir / ".perfsweep-sweep"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        print(f"perfsweep: hydra.sweep.dir={sweep_dir} already holds another sweep ({marker.name} exists); "
              "give each sweep its own folder (the default one is unique); no job was started", file=sys.stderr)
        sys.exit(2)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"pid={os.getpid()} host={os.uname().nodename} started={time.time():.0f}\n")


def _one_line(exc: BaseException) -> str:
    """Hydra's composition errors put the reason in the cause and the key on a later line."""
    parts = [str(exc)]
    if exc.__cause__ is not None:
        parts.append(str(exc.__cause__))
    lines = [ln.strip() for p in parts for ln in p.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("object_type=", "full_key:", "reference_type="))]
    return ": ".join(dict.fromkeys(lines))
