"""Scale: the campaign's status is the pause/cancel decision the claim reads
(broadcasts.paused goes), the enqueue keeps its place in the list (it runs in chunks),
retention stamps rolled-up broadcasts, and the jobs browser's Retrying tab gets an index
of its own.

Revision ID: 0022_scale
Revises: 0021_arch
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022_scale"
down_revision = "0021_arch"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_column("broadcasts", "paused")
    op.add_column("broadcasts", sa.Column("rolled_up_at", sa.DateTime(timezone=True)))
    op.add_column("broadcasts", sa.Column("enqueued_upto", sa.BigInteger(), nullable=False,
                                          server_default=sa.text("0")))
    op.create_index("delivery_jobs_retry_idx", "delivery_jobs",
                    ["priority", "available_at", "id"], unique=False,
                    postgresql_where=sa.text("status = 'retry'"))
    _finished_index(["broadcast_id", "finished_at", "id"])


def _finished_index(columns: list[str]) -> None:
    # Retention's keyset is (finished_at, id); a settled cancel shares one finished_at.
    op.drop_index("delivery_jobs_broadcast_finished_idx", table_name="delivery_jobs")
    op.create_index("delivery_jobs_broadcast_finished_idx", "delivery_jobs", columns,
                    unique=False, postgresql_where=sa.text(
                        "broadcast_id IS NOT NULL AND finished_at IS NOT NULL"))


def downgrade() -> None:
    _finished_index(["broadcast_id", "finished_at"])
    op.drop_index("delivery_jobs_retry_idx", table_name="delivery_jobs")
    op.drop_column("broadcasts", "enqueued_upto")
    op.drop_column("broadcasts", "rolled_up_at")
    op.add_column("broadcasts", sa.Column("paused", sa.Boolean(), nullable=False,
                                          server_default=sa.text("false")))
    op.execute("UPDATE broadcasts b SET paused = true FROM campaigns c "
               "WHERE c.id = b.campaign_id AND c.status = 'paused'")
