"""tracking consent per subscriber: ``subscribers.tracking`` (true: opens and clicks of this
person's campaign and sequence mail may be tracked, when the campaign or sequence tracks
them; false: their mail goes out as written, no pixel, no rewritten link). New and existing
subscribers allow it unless told otherwise (the API, a CSV ``tracking`` column, the
preference page), so a campaign that tracks goes on as before (docs/privacy.md).

Revision ID: 0045_tracking_consent
Revises: 0044_sessions
"""

from __future__ import annotations

from alembic import op

revision = "0045_tracking_consent"
down_revision = "0044_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE subscribers ADD COLUMN tracking boolean NOT NULL DEFAULT true")


def downgrade() -> None:
    op.execute("ALTER TABLE subscribers DROP COLUMN tracking")
