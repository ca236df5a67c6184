"""Initial metadata tables: dumps, dump tables, chunks, controls, stream state.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dblog_dumps",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("stream", sa.String(128), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("tables", sa.JSON, nullable=False),
        sa.Column("requested_by", sa.String(256), nullable=False),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("reason", sa.Text),
        sa.Column("chunk_size", sa.Integer),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("started_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "dblog_dump_tables",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column(
            "dump_id",
            Id,
            sa.ForeignKey("dblog_dumps.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("table_name", sa.String(512), nullable=False),
        sa.Column("key_columns", sa.JSON, nullable=False),
        sa.Column("max_key", sa.JSON),
        sa.Column("cursor", sa.JSON),
        sa.Column("estimated_rows", sa.BigInteger, nullable=False),
        sa.Column("exhausted", sa.Boolean, nullable=False),
    )
    op.create_table(
        "dblog_chunks",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column(
            "dump_id",
            Id,
            sa.ForeignKey("dblog_dumps.id", ondelete="CASCADE"),
            nullable=False,
            index=True,
        ),
        sa.Column("table_name", sa.String(512), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("lower_key", sa.JSON),
        sa.Column("upper_key", sa.JSON),
        sa.Column("keys", sa.JSON),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("claimed_by", sa.String(256)),
        sa.Column("low_watermark", sa.String(64)),
        sa.Column("high_watermark", sa.String(64)),
        sa.Column("window", sa.JSON),
        sa.Column("rows_selected", sa.BigInteger, nullable=False),
        sa.Column("rows_dropped", sa.BigInteger, nullable=False),
        sa.Column("rows_emitted", sa.BigInteger, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("started_at", sa.DateTime),
        sa.Column("selected_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime),
    )
    op.create_table(
        "dblog_controls",
        sa.Column("stream", sa.String(128), primary_key=True),
        sa.Column("chunk_size", sa.Integer),
        sa.Column("delay_ms", sa.Integer),
        sa.Column("parallelism", sa.Integer),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "dblog_stream_state",
        sa.Column("stream", sa.String(128), primary_key=True),
        sa.Column("position", sa.String(128)),
        sa.Column("source_offset", sa.JSON),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
        sa.Column("leader", sa.String(256)),
        sa.Column("last_event_at", sa.DateTime),
        sa.Column("heartbeat_at", sa.DateTime),
    )


def downgrade() -> None:
    for table in (
        "dblog_stream_state",
        "dblog_controls",
        "dblog_chunks",
        "dblog_dump_tables",
        "dblog_dumps",
    ):
        op.drop_table(table)
