"""bounces: every bounce keeps its reason (Sisimai's vocabulary), a bounce about us (a
blocklist, our reputation, our rate) is a 'sender' bounce that counts against nobody, the
suppression list keeps the reason it suppressed for, and mail the bounce reader could not
understand is listed (it was moved to the mailbox's "could not read" folder).

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_events", sa.Column("reason_code", sa.Text))
    op.drop_constraint("job_events_bounce_check", "job_events", type_="check")
    op.create_check_constraint("job_events_bounce_check", "job_events",
                               "bounce IS NULL OR bounce IN ('hard', 'soft', 'sender')")
    op.add_column("suppressions", sa.Column("reason_code", sa.Text))
    op.create_table(
        "mailbox_unreadable",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("digest", sa.Text, nullable=False, unique=True),
        sa.Column("subject", sa.Text, nullable=False, server_default=""),
        sa.Column("sender", sa.Text, nullable=False, server_default=""),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("folder", sa.Text, nullable=False, server_default=""),
        sa.Column("raw", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
    )
    op.create_index("mailbox_unreadable_created_idx", "mailbox_unreadable", ["created_at"])


def downgrade() -> None:
    op.drop_table("mailbox_unreadable")
    op.drop_column("suppressions", "reason_code")
    op.execute("DELETE FROM job_events WHERE bounce = 'sender'")
    op.drop_constraint("job_events_bounce_check", "job_events", type_="check")
    op.create_check_constraint("job_events_bounce_check", "job_events",
                               "bounce IS NULL OR bounce IN ('hard', 'soft')")
    op.drop_column("job_events", "reason_code")
