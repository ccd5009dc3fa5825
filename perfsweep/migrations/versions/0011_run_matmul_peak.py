"""A CPU run's own matmul peak, measured in the job right after its measured steps

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 22:30:00

Adds one nullable column and changes no stored value: older CPU runs keep the utilisation they
got against the sweep's peak alone (``sweeps.cpu_matmul_*_flops``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cpu_matmul_flops", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("cpu_matmul_flops")
