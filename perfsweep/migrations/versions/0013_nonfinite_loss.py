"""Measured steps whose loss was NaN or infinite, counted on the run

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 12:00:00

SQLite stores a NaN loss as NULL, and the numerics audit skipped a NULL loss as missing, so a
training that blew up was reported as a clean benchmark there. PostgreSQL kept the NaN, and the
audit flagged a run with AMP, checkpointing or compile against a finite twin, but never the
FP32-eager reference itself. From this revision every backend stores a NaN as NULL, the run
counts its non-finite losses, and a count above zero is a numerics warning. Rows stored before
keep their values (NaN on PostgreSQL) and flags; their count stays NULL (not counted).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("nonfinite_loss_steps", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("nonfinite_loss_steps")
