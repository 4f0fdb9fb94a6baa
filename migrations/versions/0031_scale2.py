"""scale2: the address index also covers a campaign's retrying jobs, so the jobs
browser's address filter is an index lookup on every tab it searches (it read a campaign's
whole waiting range at 10M)

Revision ID: 0031_scale2
Revises: 0030_tracking
"""

from __future__ import annotations

from alembic import op

revision = "0031_scale2"
down_revision = "0030_tracking"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP INDEX delivery_jobs_email_idx")
    op.execute("CREATE INDEX delivery_jobs_email_idx ON delivery_jobs (lower(email)) "
               "WHERE kind <> 'broadcast' OR status IN ('retry', 'failed', 'bounced')")


def downgrade() -> None:
    op.execute("DROP INDEX delivery_jobs_email_idx")
    op.execute("CREATE INDEX delivery_jobs_email_idx ON delivery_jobs (lower(email)) "
               "WHERE kind <> 'broadcast' OR status IN ('failed', 'bounced')")
