"""sessions a person can see and end: each web session keeps the browser that opened it
(its User-Agent, cut to 300 characters), the address it was last seen from and when
(refreshed at most once a minute), for the account page's "Your sessions" and the admin's
view of a user's sessions (docs/security.md, sessions).

Revision ID: 0044_sessions
Revises: 0043_deliv
"""

from __future__ import annotations

from alembic import op

revision = "0044_sessions"
down_revision = "0043_deliv"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE web_sessions ADD COLUMN user_agent text NOT NULL DEFAULT '', "
               "ADD COLUMN address text NOT NULL DEFAULT '', "
               "ADD COLUMN last_seen_at timestamptz NOT NULL DEFAULT now()")


def downgrade() -> None:
    op.execute("ALTER TABLE web_sessions DROP COLUMN user_agent, DROP COLUMN address, "
               "DROP COLUMN last_seen_at")
