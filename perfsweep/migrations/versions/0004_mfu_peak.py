"""MFU against the peak of the run's compute dtype; operator calls and FLOPs per step

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 08:05:00

Adds columns; changes no existing value. Old rows keep their mfu (taken against the bf16
dense peak whatever the run's dtype) with null mfu_peak_flops, so a reader can tell them apart.
ops.calls and ops.flops are totals over the profiled window; the new per-step columns are
filled for old rows too, dividing by the run's profile.active from its stored config.
"""
import json

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | Sequence[str] | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('mfu_peak_flops', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('mfu_compute_dtype', sa.String(length=8), nullable=True))
    with op.batch_alter_table('ops', schema=None) as batch_op:
        batch_op.add_column(sa.Column('calls_per_step', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('flops_per_step', sa.Float(), nullable=True))
    bind = op.get_bind()
    for run_id, config in bind.execute(sa.text(
            "SELECT id, config_json FROM runs WHERE id IN (SELECT DISTINCT run_id FROM ops)")).all():
        config = json.loads(config) if isinstance(config, str) else config
        active = ((config or {}).get("profile") or {}).get("active")
        if active:
            bind.execute(sa.text("UPDATE ops SET calls_per_step = calls * 1.0 / :n, "
                                 "flops_per_step = flops * 1.0 / :n WHERE run_id = :id"),
                         {"n": int(active), "id": run_id})


def downgrade() -> None:
    with op.batch_alter_table('ops', schema=None) as batch_op:
        batch_op.drop_column('flops_per_step')
        batch_op.drop_column('calls_per_step')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('mfu_compute_dtype')
        batch_op.drop_column('mfu_peak_flops')
