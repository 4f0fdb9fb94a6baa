"""throttle pacing: the paced send rate of a throttling relay (AIMD), the From addresses
a relay refuses (probed until it accepts them again), and one relay_state row per relay
of SENDDOCK_SMTP_URL (id = its place in the list)

Revision ID: 0021_throttle
Revises: 0027_marketers
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_throttle"
down_revision = "0027_marketers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("rate_limiter", sa.Column("paced_rate", sa.Float(), nullable=True))
    op.add_column("rate_limiter", sa.Column("paced_step", sa.Float(), nullable=True))
    op.add_column("rate_limiter", sa.Column("paced_at", sa.DateTime(timezone=True),
                                            nullable=True))
    op.drop_constraint("relay_state_single_row", "relay_state", type_="check")
    op.add_column("relay_state", sa.Column("pause_hits", sa.Integer(), nullable=False,
                                           server_default=sa.text("0")))
    op.create_table(
        "sender_refusals",
        sa.Column("sender", sa.Text, primary_key=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("last_reply", sa.Text),
        sa.Column("failures", sa.Integer, nullable=False, server_default=sa.text("1")),
        sa.Column("next_probe_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("probe_recipient", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("sender_refusals")
    op.drop_column("relay_state", "pause_hits")
    op.execute("DELETE FROM relay_state WHERE id <> 1")
    op.create_check_constraint("relay_state_single_row", "relay_state", "id = 1")
    for name in ("paced_at", "paced_step", "paced_rate"):
        op.drop_column("rate_limiter", name)
