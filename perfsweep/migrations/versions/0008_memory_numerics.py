"""Memory you can plan with and numerics you can trust: the predicted memory ledger, the
data-bound flag, GradScaler figures, the loss audit against the FP32-eager twin, and the
batch_searches table of batch=max

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 00:00:00

Adds nullable columns and changes no stored value but the new ones. Old rows get ``data_bound``
from their stored data_wait_fraction (the rule of perfsweep.names.DATA_BOUND_WAIT_FRACTION when
this was written); the ledger and the audit stay null for them: they were never predicted or
compared, and a report says so rather than guessing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DATA_BOUND_WAIT_FRACTION = 0.10  # perfsweep.names.DATA_BOUND_WAIT_FRACTION when this migration was written

RUN_COLUMNS = (
    sa.Column("predicted_params_bytes", sa.BigInteger(), nullable=True),
    sa.Column("predicted_grads_bytes", sa.BigInteger(), nullable=True),
    sa.Column("predicted_optimizer_bytes", sa.BigInteger(), nullable=True),
    sa.Column("predicted_activations_bytes", sa.BigInteger(), nullable=True),
    sa.Column("predicted_logits_bytes", sa.BigInteger(), nullable=True),
    sa.Column("predicted_slack_bytes", sa.BigInteger(), nullable=True),
    sa.Column("predicted_peak_bytes", sa.BigInteger(), nullable=True),
    sa.Column("predicted_peak_phase", sa.String(length=16), nullable=True),
    sa.Column("predicted_peak_error", sa.Float(), nullable=True),
    sa.Column("data_bound", sa.Boolean(), nullable=True),
    sa.Column("grad_scaler_final_scale", sa.Float(), nullable=True),
    sa.Column("grad_scaler_skipped_steps", sa.Integer(), nullable=True),
    sa.Column("numerics_twin_run_id", sa.Integer(), nullable=True),
    sa.Column("loss_max_rel_diff", sa.Float(), nullable=True),
    sa.Column("numerics_diverged_step", sa.Integer(), nullable=True),
    sa.Column("numerics_warning", sa.Boolean(), nullable=True),
)


def upgrade() -> None:
    op.create_table(
        "batch_searches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("grid_index", sa.Integer(), nullable=True),
        sa.Column("overrides", sa.Text(), nullable=True),
        sa.Column("seq_len", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("free_bytes", sa.BigInteger(), nullable=True),
        sa.Column("predicted_max_batch", sa.Integer(), nullable=True),
        sa.Column("max_batch", sa.Integer(), nullable=True),
        sa.Column("first_oom_batch", sa.Integer(), nullable=True),
        sa.Column("capped", sa.Boolean(), nullable=True),
        sa.Column("n_tried", sa.Integer(), nullable=True),
        sa.Column("best_run_id", sa.Integer(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("samples_per_s", sa.Float(), nullable=True),
        sa.Column("peak_allocated_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_batch_searches_sweep_id", "batch_searches", ["sweep_id"])
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for column in RUN_COLUMNS:
            batch_op.add_column(column)
        batch_op.add_column(sa.Column("batch_search_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_runs_batch_search_id", ["batch_search_id"])
        batch_op.create_foreign_key("fk_runs_batch_search_id", "batch_searches", ["batch_search_id"], ["id"])
    runs = sa.table("runs", sa.column("data_wait_fraction", sa.Float), sa.column("data_bound", sa.Boolean))
    op.get_bind().execute(
        runs.update()
        .where(runs.c.data_wait_fraction.is_not(None))
        .values(data_bound=runs.c.data_wait_fraction > DATA_BOUND_WAIT_FRACTION)
    )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_runs_batch_search_id", type_="foreignkey")
        batch_op.drop_index("ix_runs_batch_search_id")
        batch_op.drop_column("batch_search_id")
        for column in reversed(RUN_COLUMNS):
            batch_op.drop_column(column.name)
    op.drop_index("ix_batch_searches_sweep_id", table_name="batch_searches")
    op.drop_table("batch_searches")
