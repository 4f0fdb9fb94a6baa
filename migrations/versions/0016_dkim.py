"""Sending domains and their DKIM keys (docs/design.md §19).

Revision ID: 0016
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sending_domains",
        sa.Column("domain", sa.Text(), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
    )
    op.create_table(
        "dkim_keys",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("domain", sa.Text(),
                  sa.ForeignKey("sending_domains.domain", ondelete="CASCADE"), nullable=False),
        sa.Column("selector", sa.Text(), nullable=False),
        sa.Column("algorithm", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("private_key_encrypted", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.Column("activated_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("algorithm IN ('rsa', 'ed25519')", name="dkim_keys_algorithm_check"),
        sa.CheckConstraint("status IN ('next', 'active', 'retired')",
                           name="dkim_keys_status_check"),
    )
    op.create_index("dkim_keys_selector_idx", "dkim_keys", ["domain", "selector"], unique=True)
    op.create_index("dkim_keys_one_active_idx", "dkim_keys", ["domain", "algorithm"],
                    unique=True, postgresql_where=sa.text("status = 'active'"))
    op.create_index("dkim_keys_one_next_idx", "dkim_keys", ["domain", "algorithm"],
                    unique=True, postgresql_where=sa.text("status = 'next'"))


def downgrade() -> None:
    op.drop_table("dkim_keys")
    op.drop_table("sending_domains")
