"""A dumped table's bound keeps the log position it was read at.

``bound_position``: the stream's log position when the table's largest key was read. A key
above it that the lake last changed before then was not in the source when the bound was read
(anything inserted later is in the log, after it), so the table's last chunk may delete it.
Tables bounded before this revision have none: their last chunk judges by its own window.

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dblog_dump_tables") as batch:
        batch.add_column(sa.Column("bound_position", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dblog_dump_tables") as batch:
        batch.drop_column("bound_position")
