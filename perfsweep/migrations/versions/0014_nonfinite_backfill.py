"""Rows stored before 0013: NaN as NULL on PostgreSQL too, and their non-finite losses counted

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 15:00:00

0013 made every backend store a NaN as NULL and count a run's NaN or infinite measured losses in
``nonfinite_loss_steps``, but left older rows as they were: NaN in PostgreSQL's float columns
(``WHERE final_loss IS NULL`` missed them there, not on SQLite) and no count, so a training
stored before 0013 that blew up read as a clean benchmark. This revision finishes the job from
what the rows already hold: every NaN in a float column becomes NULL, and an ``ok`` run with
measured steps gets its count from them (a NULL step loss is a NaN one: every step has a loss
otherwise, and SQLite always stored NaN as NULL). A run without stored steps keeps NULL: not
counted. A run with a count above zero gets ``numerics_warning``, as the audit gives it since
0013; nothing else is recomputed.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FLOAT_TYPES = (sa.Float, sa.REAL, sa.DOUBLE_PRECISION)

TABLES = ("sweeps", "runs", "batch_searches", "steps", "stages", "kernels", "ops", "artifacts")
"""perfsweep's tables at 0013: a database it shares with other applications keeps theirs as they are."""


def _nan_to_null(bind: sa.engine.Connection) -> None:
    """PostgreSQL keeps NaN and compares it equal to itself ('NaN' = 'NaN' is true there);
    SQLite never stored one. A NOT NULL column keeps its NaN: perfsweep never wrote one there,
    and NULL would be refused."""
    inspector = sa.inspect(bind)
    for table in set(TABLES) & set(inspector.get_table_names()):
        for column in inspector.get_columns(table):
            if isinstance(column["type"], FLOAT_TYPES) and column["nullable"]:
                name = column["name"]
                t = sa.table(table, sa.column(name, sa.Float()))
                op.execute(t.update().where(t.c[name] == sa.literal(float("nan"), sa.Float())).values({name: None}))


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        _nan_to_null(bind)
    runs = sa.table(
        "runs", sa.column("id", sa.Integer()), sa.column("status", sa.String()), sa.column("nonfinite_loss_steps")
    )
    steps = sa.table(
        "steps", sa.column("run_id", sa.Integer()), sa.column("phase", sa.String()), sa.column("loss", sa.Float())
    )
    measured = sa.and_(steps.c.run_id == runs.c.id, steps.c.phase == "measure")
    infinite = steps.c.loss.in_([sa.literal(float("inf"), sa.Float()), sa.literal(float("-inf"), sa.Float())])
    count = (
        sa.select(sa.func.count())
        .select_from(steps)
        .where(measured, sa.or_(steps.c.loss.is_(None), infinite))
        .scalar_subquery()
    )
    op.execute(
        runs.update()
        .where(
            runs.c.status == "ok",
            runs.c.nonfinite_loss_steps.is_(None),
            sa.exists(sa.select(1).select_from(steps).where(measured)),
        )
        .values(nonfinite_loss_steps=count)
    )
    # the rule of perfsweep.audit since 0013: a run with a non-finite measured loss is warned
    # about, whatever its twin (the report and the summary read numerics_warning)
    warned = sa.table("runs", sa.column("nonfinite_loss_steps"), sa.column("numerics_warning", sa.Boolean()))
    op.execute(warned.update().where(warned.c.nonfinite_loss_steps > 0).values(numerics_warning=True))


def downgrade() -> None:
    """The counts and NULLs stay: they say what the rows held, and 0013's schema has room for them."""
