"""Reading results.db into pandas for the summary and the report: sweeps, runs, their detail rows.

Runs come back in one query (all ``runs`` columns but the JSON config), so a report over
10,000 runs costs one round trip. The child tables (``stages``, ``kernels``, ``steps``) are read
only for the configs a chart or an interval needs. Everything here reads; nothing writes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence

import pandas as pd
from sqlalchemy import literal_column, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from perfsweep import store
from perfsweep.cli import UserError, first_line
from perfsweep.configs import CONFIG_AXES, prepare_runs
from perfsweep.names import NOT_MEASURED, SETTING_PREFIX
from perfsweep.where import WhereError, parse_where

log = logging.getLogger(__name__)

SKIP_RUN_COLUMNS: frozenset[str] = frozenset({"config_json"})
"""Large JSON blobs no chart or table needs; leaving them out keeps the runs query fast."""


def _ids_sql(ids: Iterable[int]) -> str:
    return ", ".join(str(int(i)) for i in ids) or "NULL"


def load_sweeps(engine: Engine, sweep_ids: Sequence[int] | None = None) -> pd.DataFrame:
    sql = "SELECT id, name, sweep_dir, command, n_jobs, hostname, created_at, parallel, hydra_launcher FROM sweeps"
    where = f" WHERE id IN ({_ids_sql(sweep_ids)})" if sweep_ids is not None else ""
    return pd.read_sql_query(sql + where + " ORDER BY id", engine)


def load_batch_searches(engine: Engine, sweep_ids: Sequence[int]) -> pd.DataFrame:
    """The ``batch=max`` searches of ``sweep_ids`` (``batch_searches``), in the order they ran."""
    sql = f"SELECT * FROM batch_searches WHERE sweep_id IN ({_ids_sql(sweep_ids)}) ORDER BY id"
    return pd.read_sql_query(sql, engine)


def search_label(overrides: object) -> str:
    """A search's grid point without ``batch=max``: 'amp=true seq_len=64', or 'defaults'."""
    parts = [o for o in str(overrides or "").split() if not o.startswith("batch=")]
    return " ".join(parts) or "defaults"


def resolve_sweep(engine: Engine, spec: str | int | None, option: str = "--sweep") -> int:
    """Sweep id for ``spec``: an id, a sweeps.name (latest with that name), or None for the latest
    sweep with runs (one stopped or refused before its first job has none to show). Reads ids and
    names alone, which every schema revision has: ``perfsweep resume`` asks before it upgrades."""
    sweeps = pd.read_sql_query("SELECT id, name FROM sweeps ORDER BY id", engine)
    if sweeps.empty:
        raise UserError(f"{option}: the database has no sweeps yet")
    spec = None if spec is None else str(spec).strip()
    if spec is None:
        with engine.connect() as conn:
            with_runs = conn.execute(text("SELECT max(sweep_id) FROM runs")).scalar()
        if with_runs is None:
            n = len(sweeps)
            raise UserError(f"{option}: none of the database's {n} sweep{'s' if n != 1 else ''} has runs yet")
        return int(with_runs)
    if spec.isdigit():
        if int(spec) not in set(sweeps["id"]):
            known = ", ".join(str(i) for i in sweeps["id"].tail(10))
            raise UserError(f"{option} {spec}: no sweep with id {int(spec)} (latest ids: {known})")
        return int(spec)
    named = sweeps[sweeps["name"] == spec]
    if named.empty:
        names = ", ".join(sorted(set(sweeps["name"].astype(str)))[:10])
        raise UserError(f"{option} {spec}: no sweep with that id or name (names: {names})")
    return int(named["id"].iloc[-1])


def load_runs(
    engine: Engine, sweep_ids: Sequence[int], where: str | None = None, settings: Sequence[str] = ()
) -> pd.DataFrame:
    """All runs of ``sweep_ids``, optionally filtered by ``where`` (see perfsweep.where);
    ``settings``: config keys outside the axes (``model.width``) to give a ``cfg.<key>`` column
    whether or not the loaded runs differ in them (:func:`_with_settings`).

    The filter is parsed into an expression over ``runs`` columns with bound values, never
    pasted into SQL, so it can neither write nor reach runs of other sweeps.
    """
    runs = store.Run.__table__
    # untyped result columns: values come back as the driver gives them (JSON as text)
    columns = [literal_column(c.name) for c in runs.columns if c.name not in SKIP_RUN_COLUMNS]
    query = select(*columns).select_from(runs).where(runs.c.sweep_id.in_([int(i) for i in sweep_ids]))
    try:
        if where:
            query = query.where(parse_where(where, runs, skip=SKIP_RUN_COLUMNS))
        df = pd.read_sql_query(query, engine)
    except WhereError as exc:
        raise UserError(f"--where {where!r}: {exc}") from None
    except (DBAPIError, pd.errors.DatabaseError) as exc:
        if where:
            raise UserError(f"--where {where!r}: the database rejected it ({first_line(exc)})") from exc
        raise
    for col in ("started_at", "finished_at"):
        df[col] = pd.to_datetime(df[col], utc=True, errors="coerce", format="mixed")
    df = _with_settings(engine, df, settings)
    log.debug("loaded %d runs of sweeps %s", len(df), list(sweep_ids))
    return df


def _with_settings(engine: Engine, runs: pd.DataFrame, settings: Sequence[str] = ()) -> pd.DataFrame:
    """``runs`` plus a column per setting outside the config axes that tells configs of a sweep apart
    (``model.width``, ``data.image_size``: a sweep over a factory's own keys), named ``cfg.<key>``,
    and one per key of ``settings`` that runs have, even where they do not differ (yet).

    Only runs whose axes match another config's of the same sweep have their JSON config read,
    so a sweep over the axes alone costs nothing here."""
    if runs.empty or "config_hash" not in runs:
        return runs
    axes = [a for a in (*CONFIG_AXES, "sweep_id") if a in runs.columns]
    same = runs.groupby(axes, dropna=False)["config_hash"].transform("nunique") > 1
    if not same.any() and not settings:
        return runs
    ids = runs["id"].tolist()  # every loaded run: another sweep's matching configs (compare) need the values too
    configs = pd.read_sql_query(f"SELECT id, config_json FROM runs WHERE id IN ({_ids_sql(ids)})", engine)
    loaded = (json.loads(c) if isinstance(c, str) else c or {} for c in configs["config_json"])
    flat = pd.json_normalize([store.json_safe(c) for c in loaded])  # an older row's Infinity as the newer "inf"
    flat = flat.drop(columns=[c for c in flat.columns if c.split(".")[0] in NOT_MEASURED], errors="ignore")
    flat = flat.map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    flat.index = configs["id"].to_numpy()
    keys = runs.set_index("id").loc[flat.index, axes]
    groups = [keys[a].to_numpy() for a in axes]
    varying = [
        c
        for c in flat.columns
        if c in settings or flat[c].groupby(groups, dropna=False).nunique(dropna=False).gt(1).any()
    ]
    return runs.join(flat[varying].add_prefix(SETTING_PREFIX), on="id") if varying else runs


CHILD_COLUMNS = {
    "stages": "stage, cpu_time_ms, device_time_ms, device_time_source",
    "kernels": "category, ms_per_step",
    "steps": "step, step_time_ms, loss",
}
"""What the charts read of each child table."""


def load_child(engine: Engine, table: str, run_ids: Iterable[int]) -> pd.DataFrame:
    """The ``table`` rows of ``run_ids``; of ``steps`` the measured ones, in order."""
    steps = " AND phase = 'measure' ORDER BY run_id, step" if table == "steps" else ""
    return pd.read_sql_query(
        f"SELECT run_id, {CHILD_COLUMNS[table]} FROM {table} WHERE run_id IN ({_ids_sql(run_ids)}){steps}", engine
    )


def load_sweep_runs(engine: Engine, sweep_ids: list[int], where: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The sweeps and their runs, prepared (:func:`perfsweep.configs.prepare_runs`); a missing sweep
    or no run is a UserError."""
    sweeps = load_sweeps(engine, sweep_ids)
    if missing := sorted(set(sweep_ids) - set(sweeps["id"])) or ([] if sweep_ids else ["(none)"]):
        raise UserError(f"--sweep {missing[0]}: no sweep with id {missing[0]}")
    if (runs := load_runs(engine, sweep_ids, where)).empty:
        which = ", ".join(str(s) for s in sweep_ids)
        raise UserError(
            f"--where {where!r}: no runs of sweep {which} match" if where else f"--sweep {which}: the sweep has no runs"
        )
    return sweeps, prepare_runs(runs)
