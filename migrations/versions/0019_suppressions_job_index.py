"""An index on suppressions.job_id, for deleting or archiving jobs.

Revision ID: 0019
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("suppressions_job_idx", "suppressions", ["job_id"], unique=False,
                    postgresql_where=sa.text("job_id IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("suppressions_job_idx", table_name="suppressions")
