"""What batch=max calibrates with: a CPU job's use of job_memory_limit_mib, and the calibrated batch

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 10:00:00

batch=max calibrates its next try with the measured peak of an ok try (perfsweep.search); under
job_memory_limit_mib that peak is the address space the limit counts, not the tensors the ledger
predicts. batch_searches.calibrated_max_batch is the batch that calibration put at the edge. Rows stored
before keep NULL: neither was measured.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("memory_limit_used_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("batch_searches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("calibrated_max_batch", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batch_searches", schema=None) as batch_op:
        batch_op.drop_column("calibrated_max_batch")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("memory_limit_used_bytes")
