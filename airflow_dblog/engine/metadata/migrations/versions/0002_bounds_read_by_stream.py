"""A dumped table's upper key bound is read by the stream, not when the dump is requested.

``bounded`` is false until the stream has read the bound (after its log position is durable);
dumps recorded before this revision had theirs read at request time.

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dblog_dump_tables") as batch:
        batch.add_column(sa.Column("bounded", sa.Boolean, nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("dblog_dump_tables") as batch:
        batch.drop_column("bounded")
