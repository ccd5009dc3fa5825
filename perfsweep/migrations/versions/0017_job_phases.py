"""Where a job's time went besides its steps: its process's start, its setup, what came after

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 23:40:00

On the H100 machine a CUDA job of a second's steps took 9 to 18 s from its start to its result,
and nothing said where the rest went. The sweep's process now times each job's milestones as its
messages arrive (perfsweep.metrics.JobClock): its process up with its imports, its first step's
start, its last measured step's end, its result. Rows stored before keep NULL: not measured.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("process_start_ms", "setup_ms", "after_steps_ms")


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
