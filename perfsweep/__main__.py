"""``python -m perfsweep`` / ``perfsweep``: Hydra entry point, one call per grid point.

In a multirun, perfsweep's sweeper (hydra_plugins/perfsweep_sweeper) has already checked
every grid point and prints the summary at the end; in a single run this function does both.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from perfsweep import launcher, summary
from perfsweep.config import ConfigError, register_configs, to_run_config

register_configs()
log = logging.getLogger("perfsweep")


@hydra.main(version_base="1.3", config_path="pkg://perfsweep.conf", config_name="config")
def hydra_main(cfg: DictConfig) -> str:
    hc = HydraConfig.get()
    try:
        run_cfg = to_run_config(cfg)
    except ConfigError as exc:
        print(f"perfsweep: {exc}", file=sys.stderr)
        sys.exit(2)
    multirun = hc.mode == RunMode.MULTIRUN
    launch_dir = Path(hc.runtime.cwd)
    sweep_dir = str(Path(hc.sweep.dir if multirun else hc.run.dir).resolve())
    spec = launcher.JobSpec(
        cfg=run_cfg,
        job_dir=Path(hc.runtime.output_dir),
        launch_dir=launch_dir,
        sweep_dir=sweep_dir,
        sweep_name=run_cfg.name or hc.job.config_name or "perfsweep",
        overrides=list(hc.overrides.task),
        job_num=hc.job.num if multirun else 0,
        n_jobs=int(os.environ.get(launcher.ENV_N_JOBS, 1)) if multirun else 1,
        command=shlex.join(["perfsweep", *sys.argv[1:]]),
    )
    _, status = launcher.run_job(spec)
    if not multirun:
        summary.finish_sweep(launcher.db_url(run_cfg, launch_dir), sweep_dir)
        if status != "ok" and not run_cfg.allow_failures:
            print(f"perfsweep: {launcher.not_ok_line([status])}; exit code 1 (allow_failures=true exits 0)",
                  file=sys.stderr)
            sys.exit(1)
    return status


SUBCOMMANDS = {
    "report": "perfsweep.report.__main__",  # build reports from the database
    "trace": "perfsweep.trace",  # read a torch.profiler Chrome trace
    "query": "perfsweep.query",  # one read-only SQL query
    "upgrade": "perfsweep.upgrade",  # bring an older database to the current schema
}


def main() -> None:
    """``perfsweep report|trace|query|upgrade ...`` run those commands; anything else is a sweep."""
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        import importlib

        sys.exit(importlib.import_module(SUBCOMMANDS[sys.argv[1]]).main(sys.argv[2:]))
    try:
        hydra_main()
    except KeyboardInterrupt:
        # The sweeper has printed the summary of the jobs that finished; they are stored.
        print("perfsweep: interrupted; finished jobs are in the database", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
