"""marketers: segments and layouts.

A ``segments`` row is a saved audience: a list narrowed by conditions on subscriber
attributes, the date they joined the list and their activity (a JSON array, validated
and compiled to a parameterised predicate by ``workers.queue.audience``; never SQL).
A campaign may pick one (``campaigns.segment_id``); sending freezes its conditions on the
broadcast (``broadcasts.audience_filter``), so editing the segment later changes no send
in progress. A ``layouts`` row is reusable HTML around a campaign's body (header and
footer with the unsubscribe link and the postal address); a campaign may pick one
(``campaigns.layout_id``).

Revision ID: 0029_segments
Revises: 0021_throttle
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0029_segments"
down_revision = "0021_throttle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "segments",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("list_id", sa.BigInteger,
                  sa.ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("conditions", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("created_by", sa.BigInteger, sa.ForeignKey("users.id", ondelete="SET NULL")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
    )
    op.create_index("segments_list_name_key", "segments",
                    ["list_id", sa.literal_column("lower(name)")], unique=True)
    op.create_table(
        "layouts",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("html", sa.Text, nullable=False),
        sa.Column("postal_address", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
    )
    op.create_index("layouts_name_key", "layouts", [sa.literal_column("lower(name)")],
                    unique=True)
    op.add_column("campaigns", sa.Column(
        "segment_id", sa.BigInteger,
        sa.ForeignKey("segments.id", ondelete="SET NULL", name="campaigns_segment_id_fkey")))
    op.add_column("campaigns", sa.Column(
        "layout_id", sa.BigInteger,
        sa.ForeignKey("layouts.id", ondelete="RESTRICT", name="campaigns_layout_id_fkey")))
    op.add_column("broadcasts", sa.Column("audience_filter", JSONB))


def downgrade() -> None:
    op.drop_column("broadcasts", "audience_filter")
    op.drop_column("campaigns", "layout_id")
    op.drop_column("campaigns", "segment_id")
    op.drop_table("layouts")
    op.drop_table("segments")
