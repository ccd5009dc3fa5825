"""A run that trained but whose profiled window failed: why it has no stages

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 12:00:00

Adds one nullable column and changes no stored value: before this revision a run whose profiled
window ran out of memory was stored ``oom`` with its error, so no old ``ok`` run lacks a profile
for a reason this column would hold.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("profile_error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("profile_error")
