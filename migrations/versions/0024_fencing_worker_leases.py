"""fencing: a worker's right to send is a lease on the database clock (docs/design.md §15).

``workers.lease_until`` is renewed by the worker's heartbeat; a worker's jobs are taken
back once it is older than that plus a grace period, never because a session or an
advisory lock looks gone (``lock_key`` is dropped). ``lease_term`` counts the leases that
lapsed before their renewal: a worker whose lease lapsed gives back what it claimed
under the old term instead of sending it.

Revision ID: 0023_fencing
Revises: 0022_scale
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_fencing"
down_revision = "0022_scale"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("lease_until", sa.DateTime(timezone=True),
                                       nullable=False, server_default=sa.text("now()")))
    op.add_column("workers", sa.Column("lease_term", sa.Integer, nullable=False,
                                       server_default=sa.text("0")))
    op.drop_column("workers", "lock_key")


def downgrade() -> None:
    op.add_column("workers", sa.Column("lock_key", sa.BigInteger))
    op.execute("UPDATE workers SET lock_key = (random() * 4e18)::bigint")
    op.alter_column("workers", "lock_key", nullable=False)
    op.create_unique_constraint("workers_lock_key_key", "workers", ["lock_key"])
    op.drop_column("workers", "lease_term")
    op.drop_column("workers", "lease_until")
