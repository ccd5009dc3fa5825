"""Scale out: where a job ran (its cores, GPUs and SLURM job), data-parallel jobs' figures, and a
sweep's concurrency

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 08:00:00

Adds nullable columns and changes no stored value but the new ones: old runs were plain
single-process jobs, so their ``nproc`` stays null (no DDP) and ``global_batch`` = ``batch``; old
sweeps ran one job at a time (``parallel`` 1). Where an old run's cores were is unknown: null.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_COLUMNS = (
    sa.Column("cpu_affinity", sa.String(length=255), nullable=True),
    sa.Column("cpus_allotted", sa.Integer(), nullable=True),
    sa.Column("cuda_visible_devices", sa.String(length=255), nullable=True),
    sa.Column("slurm_job_id", sa.String(length=32), nullable=True),
    sa.Column("nproc", sa.Integer(), nullable=True),
    sa.Column("global_batch", sa.Integer(), nullable=True),
    sa.Column("tokens_per_s_per_rank", sa.Float(), nullable=True),
    sa.Column("samples_per_s_per_rank", sa.Float(), nullable=True),
    sa.Column("slowest_rank", sa.Integer(), nullable=True),
    sa.Column("slowest_rank_step_time_ms_median", sa.Float(), nullable=True),
    sa.Column("allreduce_ms_per_step", sa.Float(), nullable=True),
)
SWEEP_COLUMNS = (
    sa.Column("parallel", sa.Integer(), nullable=True),
    sa.Column("hydra_launcher", sa.String(length=100), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in RUN_COLUMNS:
            batch_op.add_column(column)
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        for column in SWEEP_COLUMNS:
            batch_op.add_column(column)
    runs = sa.table("runs", sa.column("batch", sa.Integer), sa.column("global_batch", sa.Integer))
    op.get_bind().execute(runs.update().values(global_batch=runs.c.batch))
    sweeps = sa.table("sweeps", sa.column("parallel", sa.Integer))
    op.get_bind().execute(sweeps.update().values(parallel=1))


def downgrade() -> None:
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        for column in reversed(SWEEP_COLUMNS):
            batch_op.drop_column(column.name)
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in reversed(RUN_COLUMNS):
            batch_op.drop_column(column.name)
