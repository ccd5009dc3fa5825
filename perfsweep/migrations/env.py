"""Alembic environment: perfsweep passes an open connection, so no alembic.ini is needed."""

from alembic import context

from perfsweep.store import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("perfsweep migrations run through perfsweep.store.upgrade(), which passes a connection")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copy
)
with context.begin_transaction():
    context.run_migrations()
