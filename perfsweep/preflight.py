"""Everything checked before the first job starts: each mistake answered in one line, exit 2.

Hydra composes and type-checks the config and ``config.py`` range-checks it; what neither can
see is checked here, for every grid point, before any job process exists: the device asked
for is on this machine, the data exists and holds at least one batch, and the database takes
a write (the sweep's row is reserved with it). Hydra's own multi-line composition errors are
turned into one line that names the key and the value. The sweeper and the single-run entry
point call the same functions, so ``-m`` and a plain run answer a mistake the same way.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from perfsweep.cli import first_line
from perfsweep.config import AmpDtype, ConfigError, DataKind, Device, PerfsweepConfig, to_plain_dict

COMPOSE_ERRORS: tuple[type[BaseException], ...] = (ConfigError, HydraException, OmegaConfBaseException)
"""What composing and validating a grid point can raise for bad input (anything else is a bug)."""

NO_JOB = "no job was started"


def error_line(exc: BaseException) -> str:
    """One line for a composition or validation error: key, value and what is allowed.

    Hydra puts the reason in the exception's cause and the key on later lines, and answers an
    unknown preset with the whole config search path; a person needs the name they mistyped and
    the closest one that exists.
    """
    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, name = str(exc.missing_cfg_file).rpartition("/")
        choices = sorted(o for o in exc.options if not o.endswith("_schema"))
        close = difflib.get_close_matches(name, choices, n=1)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        key = group or "config name (-cn)"
        return f"{key}={name}: no such preset; {hint}choices: {', '.join(choices)}"
    parts = [str(exc)]
    if exc.__cause__ is not None:
        parts.append(str(exc.__cause__))
    lines = [ln.strip() for p in parts for ln in p.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("object_type=", "full_key:", "reference_type=", "Set the environment"))]
    return ": ".join(dict.fromkeys(lines)) or type(exc).__name__


def check_device(cfgs: list[PerfsweepConfig]) -> None:
    """A CUDA-only setting on a machine where torch sees no GPU is refused here, not in job 1."""
    import torch

    if torch.cuda.is_available():
        return
    why = f"torch {torch.__version__} sees no CUDA device on this machine"
    for cfg in cfgs:
        if cfg.device == Device.cuda:
            raise ConfigError(f"invalid config: device='cuda': {why}; use device=cpu or device=auto")
        if cfg.amp and cfg.amp_dtype == AmpDtype.fp16:
            raise ConfigError(
                f"invalid config: amp_dtype='fp16': fp16 autocast needs CUDA and {why}; use amp_dtype=bf16"
            )


def check_data(cfgs: list[PerfsweepConfig]) -> None:
    """Every grid point's corpus exists, is not empty and holds one batch of windows.

    The corpus is tokenized here (once; jobs then hit the cache), so the count is exact.
    """
    from perfsweep import data as data_mod

    prepared: dict[str, Any] = {}
    for cfg in cfgs:
        d = cfg.data
        where = _data_key(cfg)
        if d.kind == DataKind.textfile:
            try:
                files = data_mod.text_files(d.path or "", d.glob)
            except FileNotFoundError as exc:
                raise ConfigError(f"invalid config: {exc}; point data.path at a UTF-8 text file or folder") from None
            if sum(f.stat().st_size for f in files) == 0:
                raise ConfigError(f"invalid config: {where}: the text is empty (0 bytes); use a file with text in it")
        key = json.dumps([to_plain_dict(cfg)["data"], cfg.seed], sort_keys=True)
        if key not in prepared:
            try:
                prepared[key] = data_mod.prepare(d, cfg.seed)
            except (OSError, ValueError, RuntimeError) as exc:
                raise ConfigError(f"invalid config: {where}: {first_line(exc)}") from None
        n_tokens = prepared[key].n_tokens
        needed = cfg.batch * cfg.seq_len + 1
        if (n_tokens - 1) // cfg.seq_len < cfg.batch:
            raise ConfigError(
                f"invalid config: {where}: holds {n_tokens:,} tokens, fewer than one batch "
                f"(batch={cfg.batch} windows of seq_len={cfg.seq_len} need {needed:,}); "
                "use more text or lower batch or seq_len"
            )


def _data_key(cfg: PerfsweepConfig) -> str:
    d = cfg.data
    if d.kind == DataKind.textfile:
        return f"data.path={d.path!r}"
    if d.kind == DataKind.synthetic:
        return f"data.synthetic_tokens={d.synthetic_tokens}"
    return f"data={d.name}"


@dataclass
class Reservation:
    """The sweep's row, written before any job: proof that the database takes writes."""

    url: str
    sweep_id: int


def reserve_sweep(url: str, sweep_dir: str, name: str, **fields: Any) -> Reservation:
    """Open ``url``, upgrade its schema and write the sweep's row as ``running``.

    A wrong URL, a server that is down, a read-only file or folder: each fails here with the
    driver's first line, before any job could measure something it then cannot store.
    """
    from perfsweep import store

    hint = "; a SQLite file and its folder must be writable" if url.startswith("sqlite") else ""
    try:
        engine = store.connect(url)
    except Exception as exc:  # noqa: BLE001 - any driver error; its first line says what
        raise ConfigError(f"cannot open db.url={url!r}: {first_line(exc)}{hint}") from None
    try:
        sweep_id = store.start_sweep(engine, sweep_dir, name, **fields)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"cannot write to db.url={url!r}: {first_line(exc)}{hint}") from None
    finally:
        engine.dispose()
    return Reservation(url, sweep_id)


def check_all(cfgs: list[PerfsweepConfig]) -> None:
    """The checks that need no database: device, then data."""
    check_device(cfgs)
    check_data(cfgs)


def done_grid_points(url: str, sweep_id: int) -> set[tuple[int, str]]:
    """(job_num, config_hash) of the grid points of a sweep that already have an ``ok`` run."""
    from sqlalchemy import select

    from perfsweep import store

    engine = store.connect(url)
    try:
        with store.session(engine) as s:
            rows = s.execute(select(store.Run.job_num, store.Run.config_hash)
                             .where(store.Run.sweep_id == sweep_id, store.Run.status == "ok")).all()
    finally:
        engine.dispose()
    return {(int(j), h) for j, h in rows if j is not None}
