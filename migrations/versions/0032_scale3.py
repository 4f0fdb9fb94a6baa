"""scale3: a broadcast records the span of its jobs' ids (a cancel's settler
walks it along the primary key), and delivery_jobs_broadcast_idx holds only a campaign's
retrying and problem jobs (an entry on every job cost every enqueue, settle, send and
transactional insert one more index write)

Revision ID: 0032_scale3
Revises: 0031_scale2
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032_scale3"
down_revision = "0031_scale2"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("broadcasts", sa.Column("first_job_id", sa.BigInteger()))
    op.add_column("broadcasts", sa.Column("last_job_id", sa.BigInteger()))
    op.execute("DROP INDEX delivery_jobs_broadcast_idx")
    op.execute("CREATE INDEX delivery_jobs_broadcast_idx ON delivery_jobs "
               "(broadcast_id, status) WHERE broadcast_id IS NOT NULL "
               "AND status IN ('retry', 'failed', 'bounced')")


def downgrade() -> None:
    op.execute("DROP INDEX delivery_jobs_broadcast_idx")
    op.execute("CREATE INDEX delivery_jobs_broadcast_idx ON delivery_jobs "
               "(broadcast_id, status)")
    op.drop_column("broadcasts", "last_job_id")
    op.drop_column("broadcasts", "first_job_id")
