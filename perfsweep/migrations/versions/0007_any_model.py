"""Any model: FLOPs per sample, where the FLOPs figure came from, seq_len nullable

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 18:30:00

Adds nullable columns, lets runs.seq_len be null (models whose unit is samples), and changes no
stored value but the new ones. Every earlier row is
perfsweep's GPT, whose FLOPs came from its formula: flops_method 'formula', and flops_per_sample
= flops_per_token x seq_len (a sample is one sequence).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_COLUMNS = (
    sa.Column("flops_per_sample", sa.Float(), nullable=True),
    sa.Column("flops_method", sa.String(length=16), nullable=True),
)


def upgrade() -> None:
    # SQLite changes a column's NULL constraint by copying the table: perfsweep.store.upgrade runs
    # migrations with its foreign keys off (the old copy's drop would fail on the child tables'
    # references) and checks every reference before it commits.
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in RUN_COLUMNS:
            batch_op.add_column(column)
        batch_op.alter_column("seq_len", existing_type=sa.Integer(), nullable=True)
    runs = sa.table(
        "runs",
        sa.column("flops_per_token", sa.Float),
        sa.column("seq_len", sa.Integer),
        sa.column("flops_per_sample", sa.Float),
        sa.column("flops_method", sa.String),
    )
    op.get_bind().execute(
        runs.update()
        .where(runs.c.flops_per_token.is_not(None))
        .values(flops_per_sample=runs.c.flops_per_token * runs.c.seq_len, flops_method="formula")
    )


def downgrade() -> None:
    # seq_len stays nullable: rows of samples models would not fit a NOT NULL column
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in reversed(RUN_COLUMNS):
            batch_op.drop_column(column.name)
