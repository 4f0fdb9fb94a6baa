"""tracking: privacy-friendly analytics and the public archive.

- ``campaign_tracking``: per campaign, whether opens and clicks are tracked and whether a
  public web version (archive) exists. No row means all off (the default).
- ``campaign_links``: the links of a tracked campaign, each once; a tracking URL names a
  row here, and the redirect goes to its stored URL (never to one read from the request).
- ``campaign_events``: one row per open or click (no IP, no user agent). Indexed by
  (subscriber_id, kind, at) for segments ("opened in the last N days") and by
  (campaign_id, kind, at) for the campaign's figures.

Revision ID: 0030_tracking
Revises: 0029_segments
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030_tracking"
down_revision = "0029_segments"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "campaign_tracking",
        sa.Column("campaign_id", sa.BigInteger,
                  sa.ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("track_opens", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("track_clicks", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("archive", sa.Boolean, nullable=False, server_default=sa.text("false")),
    )
    op.create_table(
        "campaign_links",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("campaign_id", sa.BigInteger,
                  sa.ForeignKey("campaigns.id", ondelete="CASCADE"), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.UniqueConstraint("campaign_id", "url", name="campaign_links_campaign_url_key"),
    )
    op.create_table(
        "campaign_events",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("campaign_id", sa.BigInteger,
                  sa.ForeignKey("campaigns.id", ondelete="CASCADE"), nullable=False),
        sa.Column("broadcast_id", sa.BigInteger),
        sa.Column("job_id", sa.BigInteger, nullable=False),
        sa.Column("subscriber_id", sa.BigInteger,
                  sa.ForeignKey("subscribers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("link_id", sa.BigInteger,
                  sa.ForeignKey("campaign_links.id", ondelete="CASCADE")),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.CheckConstraint("kind IN ('open', 'click')", name="campaign_events_kind_check"),
        sa.CheckConstraint("(kind = 'click') = (link_id IS NOT NULL)",
                           name="campaign_events_link_check"),
    )
    op.create_index("campaign_events_subscriber_idx", "campaign_events",
                    ["subscriber_id", "kind", "at"])
    op.create_index("campaign_events_campaign_idx", "campaign_events",
                    ["campaign_id", "kind", "at"])
    op.create_index("campaign_events_link_idx", "campaign_events", ["link_id"])


def downgrade() -> None:
    op.drop_table("campaign_events")
    op.drop_table("campaign_links")
    op.drop_table("campaign_tracking")
