"""The stream state keeps the source time its committed position stands for.

``source_ts_ms``: the source's commit timestamp (ms since the epoch) of the last change the
stream committed, or the time a heartbeat found the log read to its end, whichever is later;
``dblog status`` reads seconds behind from it. Streams that committed before this revision
have none until their next commit.

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dblog_stream_state") as batch:
        batch.add_column(sa.Column("source_ts_ms", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dblog_stream_state") as batch:
        batch.drop_column("source_ts_ms")
