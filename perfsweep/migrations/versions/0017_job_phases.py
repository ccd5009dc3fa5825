"""Where a job's time went besides its steps: its process's start, its setup, what came after

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 23:40:00

On the H100 machine a CUDA job of a second's steps took 9 to 18 s from its start to its result,
and nothing said where the rest went. Each job's milestones are now read on the host's monotonic
clock (perfsweep.metrics.JobClock): its process up with its imports and its result by the sweep's
process, its first step's start and its measured window's end by the job. Rows stored before
keep NULL: not measured.
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
