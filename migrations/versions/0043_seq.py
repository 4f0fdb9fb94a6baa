"""sequence mail tracking: opens and clicks of a sequence's messages (docs/sequences.md)

``sequences.track_opens`` / ``track_clicks``: off unless a marketer turns them on, as for a
campaign. ``sequence_links``: each tracked link of an email step, stored once (a tracking
URL names its row, the redirect goes to the stored URL). ``sequence_events``: one row per
open or click of one message (``job_id``: the (enrollment, step) pair's one job), read by
the "opened / clicked the previous email" condition and the funnel. No IP address, no user
agent.

Revision ID: 0043_seq
Revises: 0042_preferences
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0043_seq"
down_revision = "0042_preferences"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sequences", sa.Column("track_opens", sa.Boolean, nullable=False,
                                         server_default=sa.text("false")))
    op.add_column("sequences", sa.Column("track_clicks", sa.Boolean, nullable=False,
                                         server_default=sa.text("false")))
    op.create_table(
        "sequence_links",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("step_id", sa.BigInteger,
                  sa.ForeignKey("sequence_steps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.UniqueConstraint("step_id", "url", name="sequence_links_step_url_key"),
    )
    op.create_table(
        "sequence_events",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("step_id", sa.BigInteger,
                  sa.ForeignKey("sequence_steps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("job_id", sa.BigInteger, nullable=False),
        sa.Column("subscriber_id", sa.BigInteger,
                  sa.ForeignKey("subscribers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("link_id", sa.BigInteger,
                  sa.ForeignKey("sequence_links.id", ondelete="CASCADE")),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.CheckConstraint("kind IN ('open', 'click')", name="sequence_events_kind_check"),
        sa.CheckConstraint("(kind = 'click') = (link_id IS NOT NULL)",
                           name="sequence_events_link_check"),
    )
    op.create_index("sequence_events_job_idx", "sequence_events", ["job_id", "kind"])
    op.create_index("sequence_events_step_idx", "sequence_events", ["step_id", "kind"])
    op.create_index("sequence_events_subscriber_idx", "sequence_events",
                    ["subscriber_id", "kind", "at"])
    op.create_index("sequence_events_link_idx", "sequence_events", ["link_id"])


def downgrade() -> None:
    op.drop_table("sequence_events")
    op.drop_table("sequence_links")
    op.drop_column("sequences", "track_clicks")
    op.drop_column("sequences", "track_opens")
