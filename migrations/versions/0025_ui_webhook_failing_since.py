"""webhook_endpoints.failing_since: when the endpoint's current run of failures began. An
endpoint is disabled after failing continuously for SENDDOCK_EVENT_WEBHOOK_DISABLE_AFTER_
SECONDS (3 days, as Stripe), not after a count of failures (one campaign's
bounces disabled an endpoint within 90 s).

Revision ID: 0021ui
Revises: 0023_fencing
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021ui"
down_revision = "0023_fencing"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("webhook_endpoints",
                  sa.Column("failing_since", sa.DateTime(timezone=True)))
    # An endpoint failing now has failed at least since its last attempt.
    op.execute("UPDATE webhook_endpoints SET failing_since = last_attempt_at "
               "WHERE consecutive_failures > 0")


def downgrade() -> None:
    op.drop_column("webhook_endpoints", "failing_since")
