"""The rule that judged a run's noisy flag, stored beside it

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 09:00:00

From this revision a run is also noisy when its mean step time is more than 10% off its median (a
few stalls the IQR does not see). Stored flags are not recomputed: older rows keep the verdict of
the rule that judged them, and this column says which it was, the IQR alone. The text is written
out here, not taken from perfsweep.names, so that a later change of the rule cannot rewrite
history.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IQR_ONLY = "step-time IQR > 10% of the median"
"""The rule of every flag stored before this revision (perfsweep.names.NOISY_IQR_FRACTION = 0.10)."""


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("noisy_rule", sa.String(length=200), nullable=True))
    runs = sa.table("runs", sa.column("noisy", sa.Boolean()), sa.column("noisy_rule", sa.String()))
    op.execute(runs.update().where(runs.c.noisy.is_not(None)).values(noisy_rule=IQR_ONLY))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("noisy_rule")
