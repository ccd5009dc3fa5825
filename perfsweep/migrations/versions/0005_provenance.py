"""Provenance: what else changes a run's numbers (GPU, driver, math modes, allocator, CPU model)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 13:00:00

Adds nullable columns. Old rows stored the dirty state as a "-dirty" suffix of git_commit;
their git_dirty is filled from it (the suffix stays, so no stored value changes).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | Sequence[str] | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    sa.Column('cpu_model', sa.String(length=255), nullable=True),
    sa.Column('cudnn_version', sa.String(length=16), nullable=True),
    sa.Column('gpu_driver_version', sa.String(length=32), nullable=True),
    sa.Column('gpu_total_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('gpu_compute_capability', sa.String(length=8), nullable=True),
    sa.Column('tf32_matmul', sa.Boolean(), nullable=True),
    sa.Column('tf32_cudnn', sa.Boolean(), nullable=True),
    sa.Column('cudnn_benchmark', sa.Boolean(), nullable=True),
    sa.Column('cuda_alloc_conf', sa.String(length=255), nullable=True),
    sa.Column('git_dirty', sa.Boolean(), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        for column in COLUMNS:
            batch_op.add_column(column)
    runs = sa.table('runs', sa.column('git_commit', sa.String), sa.column('git_dirty', sa.Boolean))
    op.execute(
        runs.update()
        .where(runs.c.git_commit.is_not(None))
        .values(git_dirty=runs.c.git_commit.like('%-dirty'))
    )


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        for column in reversed(COLUMNS):
            batch_op.drop_column(column.name)
