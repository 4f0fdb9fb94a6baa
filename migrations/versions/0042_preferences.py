"""subscriber preferences (issue 43, item 4): leaving one list leaves the others

``list_unsubscribes`` keeps, per list and subscriber, that the person left the list (when,
how, from which campaign's message). Leaving deletes the membership, so no campaign of that
list reaches them, and nothing adds it back but a new confirmed consent (double opt-in),
which deletes the row. ``subscribers.locale`` is the language the person chose on their
preference page (NULL: never chosen).

Revision ID: 0042_preferences
Revises: 0037_bulk_class
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0042_preferences"
down_revision = "0037_bulk_class"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("subscribers", sa.Column("locale", sa.Text()))
    op.create_table(
        "list_unsubscribes",
        sa.Column("list_id", sa.BigInteger(),
                  sa.ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
        sa.Column("subscriber_id", sa.BigInteger(),
                  sa.ForeignKey("subscribers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("campaign_id", sa.BigInteger()),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("list_id", "subscriber_id"),
    )
    op.create_index("list_unsubscribes_subscriber_idx", "list_unsubscribes",
                    ["subscriber_id"])


def downgrade() -> None:
    op.drop_table("list_unsubscribes")
    op.drop_column("subscribers", "locale")
