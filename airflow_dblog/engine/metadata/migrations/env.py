"""Alembic environment: the store passes its open connection in ``config.attributes``."""

from __future__ import annotations

from alembic import context

from airflow_dblog.engine.metadata.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table="dblog_alembic_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
