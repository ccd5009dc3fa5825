"""How each job's process started: spawned, or forked from the sweep's job server

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26 20:30:00

launcher.start_method lets a CPU job fork from a server that imported torch once for the sweep
(about 2 s less per job on a 2-core CPU) where each job used to spawn a new interpreter. The run
records which it was, so figures from either can be told apart. Rows stored before keep NULL:
those jobs were all spawned, but the column says only what a job reported itself.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("start_method", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("start_method")
