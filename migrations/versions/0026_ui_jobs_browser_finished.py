"""The jobs browser's Sent and Cancelled tabs page newest first on (finished_at,
id): delivery_jobs_sent_at_idx (finished_at) becomes delivery_jobs_sent_idx (finished_at,
id) -- it serves the sent-per-minute reads as before -- and cancelled jobs get their own.

Revision ID: 0022ui
Revises: 0021ui
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022ui"
down_revision = "0021ui"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("delivery_jobs_sent_idx", "delivery_jobs", ["finished_at", "id"],
                    postgresql_where=sa.text("status = 'sent'"))
    op.drop_index("delivery_jobs_sent_at_idx", table_name="delivery_jobs")
    op.create_index("delivery_jobs_cancelled_idx", "delivery_jobs", ["finished_at", "id"],
                    postgresql_where=sa.text("status = 'cancelled'"))


def downgrade() -> None:
    op.drop_index("delivery_jobs_cancelled_idx", table_name="delivery_jobs")
    op.create_index("delivery_jobs_sent_at_idx", "delivery_jobs", ["finished_at"],
                    postgresql_where=sa.text("status = 'sent'"))
    op.drop_index("delivery_jobs_sent_idx", table_name="delivery_jobs")
