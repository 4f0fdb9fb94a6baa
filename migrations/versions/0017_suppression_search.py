"""Search the suppression list by any part of the address (a domain, a fragment): a
trigram index on suppressions.email.

Revision ID: 0017
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    op.execute("CREATE INDEX suppressions_email_trgm_idx ON suppressions "
               "USING gin (email gin_trgm_ops)")


def downgrade() -> None:
    op.drop_index("suppressions_email_trgm_idx", table_name="suppressions")
