"""Verify dumps: a dump may compare instead of write, and each chunk keeps what it found.

``dblog_dumps.verify``: ``repair`` (compare, then re-read and write only what differs) or
``dry-run`` (compare and report only); null for an ordinary dump. ``dblog_chunks.verified``:
the chunk's counts (checked, missing, extra, different, repaired) and a few example keys,
written once, when the lake has compared the chunk.

Revision ID: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dblog_dumps") as batch:
        batch.add_column(sa.Column("verify", sa.String(16), nullable=True))
    with op.batch_alter_table("dblog_chunks") as batch:
        batch.add_column(sa.Column("verified", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dblog_chunks") as batch:
        batch.drop_column("verified")
    with op.batch_alter_table("dblog_dumps") as batch:
        batch.drop_column("verify")
