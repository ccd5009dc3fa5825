"""Run lifecycle: running and interrupted rows, heartbeats, resumable sweeps, idempotent import

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 07:20:00

Adds columns only; every existing row survives. Old sweeps and runs get nulls in the new
columns: they finished before perfsweep wrote rows at job start, so none of them is running.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | Sequence[str] | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('status', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('launch_dir', sa.String(length=1000), nullable=True))
        batch_op.add_column(sa.Column('pid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('run_uid', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('pid', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_runs_run_uid'), ['run_uid'], unique=True)


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_run_uid'))
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('pid')
        batch_op.drop_column('run_uid')
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_column('finished_at')
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('pid')
        batch_op.drop_column('launch_dir')
        batch_op.drop_column('status')
