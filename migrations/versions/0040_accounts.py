"""accounts (issue 44): scoped API tokens

``api_tokens.scopes`` (``webapp.access.SCOPES``) and ``last_used_addr``. A token that
existed before keeps what it could do: every scope its owner's role may hold.

Revision ID: 0040_accounts
Revises: 0037_bulk_class
"""

from __future__ import annotations

from alembic import op

revision = "0040_accounts"
down_revision = "0037_bulk_class"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE api_tokens
            ADD COLUMN scopes text[] NOT NULL DEFAULT '{}'::text[],
            ADD COLUMN last_used_addr text""")
    op.execute("""
        UPDATE api_tokens t SET scopes = CASE u.role
            WHEN 'admin' THEN ARRAY['send', 'read_jobs', 'campaigns', 'admin']
            WHEN 'marketer' THEN ARRAY['campaigns', 'read_jobs']
            ELSE ARRAY['send', 'read_jobs'] END
          FROM users u WHERE u.id = t.user_id""")


def downgrade() -> None:
    op.execute("ALTER TABLE api_tokens DROP COLUMN scopes, DROP COLUMN last_used_addr")
