"""GPU truth: bottleneck verdict, kernel categories, compile cache mode, padded vocabulary

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 01:00:00

Adds columns and one table; drops nothing, so every existing row survives with nulls in the new
columns (the verdict of an old GPU run cannot be recomputed: its stages lack backward GPU time).
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | Sequence[str] | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gpu_busy_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('gpu_busy_fraction', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('bottleneck', sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column('bottleneck_rule', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('vocab_size_padded', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('compile_cache', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('compile_cache_hits', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_runs_bottleneck'), ['bottleneck'], unique=False)

    op.create_table('kernels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('category', sa.String(length=32), nullable=False),
    sa.Column('ms_per_step', sa.Float(), nullable=False),
    sa.Column('kernels_per_step', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('kernels', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_kernels_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('kernels', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_kernels_run_id'))
    op.drop_table('kernels')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_bottleneck'))
        for col in ('compile_cache_hits', 'compile_cache', 'vocab_size_padded', 'bottleneck_rule',
                    'bottleneck', 'gpu_busy_fraction', 'gpu_busy_ms'):
            batch_op.drop_column(col)
