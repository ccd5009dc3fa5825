"""Numbers you can defend: repeats, steady state, timing mode, IQR/CV/noisy, speedup intervals,
CPU utilisation against a measured matmul peak

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 14:00:00

Adds nullable columns and changes no stored value. Old rows get what their stored steps
determine: IQR, CV and the noisy flag from their measured steps; measure_wall_ms as the sum of
their measured step times (what their tokens_per_s was taken over); timing_mode 'sync' (the
only mode there was); measure_start_step = warmup_steps; repeat_index 0; grid_index = job_num
(jobs ran in grid order). steady_state stays
null: the check did not exist.
"""

from collections.abc import Sequence

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NOISY_IQR_FRACTION = 0.10  # perfsweep.names.NOISY_IQR_FRACTION when this migration was written

RUN_COLUMNS = (
    sa.Column("repeat_index", sa.Integer(), nullable=True),
    sa.Column("grid_index", sa.Integer(), nullable=True),
    sa.Column("measure_start_step", sa.Integer(), nullable=True),
    sa.Column("steady_state", sa.Boolean(), nullable=True),
    sa.Column("timing_mode", sa.String(length=8), nullable=True),
    sa.Column("step_time_ms_iqr", sa.Float(), nullable=True),
    sa.Column("step_time_cv", sa.Float(), nullable=True),
    sa.Column("noisy", sa.Boolean(), nullable=True),
    sa.Column("measure_wall_ms", sa.Float(), nullable=True),
    sa.Column("cpu_flops_utilisation", sa.Float(), nullable=True),
    sa.Column("speedup", sa.Float(), nullable=True),
    sa.Column("speedup_ci_lo", sa.Float(), nullable=True),
    sa.Column("speedup_ci_hi", sa.Float(), nullable=True),
    sa.Column("speedup_basis", sa.String(length=16), nullable=True),
    sa.Column("speedup_verdict", sa.String(length=32), nullable=True),
    sa.Column("baseline_config_hash", sa.String(length=64), nullable=True),
)
SWEEP_COLUMNS = (
    sa.Column("cpu_matmul_fp32_flops", sa.Float(), nullable=True),
    sa.Column("cpu_matmul_bf16_flops", sa.Float(), nullable=True),
    sa.Column("cpu_matmul_threads", sa.Integer(), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in RUN_COLUMNS:
            batch_op.add_column(column)
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        for column in SWEEP_COLUMNS:
            batch_op.add_column(column)
    conn = op.get_bind()
    runs = sa.table(
        "runs",
        sa.column("id", sa.Integer),
        sa.column("warmup_steps", sa.Integer),
        sa.column("step_time_ms_iqr", sa.Float),
        sa.column("step_time_cv", sa.Float),
        sa.column("noisy", sa.Boolean),
        sa.column("measure_wall_ms", sa.Float),
        sa.column("timing_mode", sa.String),
        sa.column("measure_start_step", sa.Integer),
        sa.column("repeat_index", sa.Integer),
        sa.column("grid_index", sa.Integer),
        sa.column("job_num", sa.Integer),
    )
    conn.execute(
        runs.update().values(
            timing_mode="sync", measure_start_step=runs.c.warmup_steps, repeat_index=0, grid_index=runs.c.job_num
        )
    )
    times: dict[int, list[float]] = {}
    for run_id, ms in conn.execute(
        sa.text("SELECT run_id, step_time_ms FROM steps WHERE phase = 'measure' ORDER BY run_id, step")
    ):
        times.setdefault(run_id, []).append(ms)
    for run_id, values in times.items():
        t = np.asarray(values, dtype=float)
        p25, p50, p75 = np.percentile(t, [25, 50, 75])
        mean = float(t.mean())
        std = float(t.std(ddof=1)) if len(t) > 1 else 0.0
        conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(
                step_time_ms_iqr=float(p75 - p25),
                step_time_cv=std / mean if mean > 0 else 0.0,
                noisy=bool(p50 > 0 and (p75 - p25) / p50 > NOISY_IQR_FRACTION),
                measure_wall_ms=float(t.sum()),
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        for column in reversed(SWEEP_COLUMNS):
            batch_op.drop_column(column.name)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in reversed(RUN_COLUMNS):
            batch_op.drop_column(column.name)
