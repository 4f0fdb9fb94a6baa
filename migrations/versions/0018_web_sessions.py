"""Server-side sessions: a row per login, so logout, a password change and disabling a
user end every copy of a session cookie.

Revision ID: 0018
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.BigInteger(),
                  sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
    )
    op.create_index("web_sessions_user_idx", "web_sessions", ["user_id"])


def downgrade() -> None:
    op.drop_index("web_sessions_user_idx", table_name="web_sessions")
    op.drop_table("web_sessions")
