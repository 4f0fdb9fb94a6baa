"""API tokens may expire; each user may choose the UI language; support finds users by
any part of an address or user id (a trigram index on transactional jobs).

Revision ID: 0017a
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017a"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.add_column("users", sa.Column("locale", sa.Text()))
    op.execute("CREATE INDEX delivery_jobs_transactional_search_idx ON delivery_jobs "
               "USING gin (lower(email || ' ' || coalesce(user_ref, '')) gin_trgm_ops) "
               "WHERE kind <> 'broadcast'")


def downgrade() -> None:
    op.drop_index("delivery_jobs_transactional_search_idx", table_name="delivery_jobs")
    op.drop_column("users", "locale")
    op.drop_column("api_tokens", "expires_at")
