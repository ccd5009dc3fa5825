"""MFU against the peak of the run's compute dtype: which peak and which dtype

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 08:05:00

Adds two columns. Old rows keep their mfu (taken against the bf16 dense peak whatever the
run's dtype) with nulls here, so a reader can tell them apart; nothing is recomputed.
"""
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


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('mfu_compute_dtype')
        batch_op.drop_column('mfu_peak_flops')
