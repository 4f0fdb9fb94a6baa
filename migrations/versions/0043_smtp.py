"""SMTP submission: failed AUTH per client address, counted in the database so every
``senddock smtp`` process shares one lockout; the cumulative counts of submission replies by
outcome and code that /metrics reports (docs/smtp.md).

Revision ID: 0043_smtp
Revises: 0042_preferences
"""

from __future__ import annotations

from alembic import op

revision = "0043_smtp"
down_revision = "0043_seq"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE smtp_auth_failures (
            id bigserial PRIMARY KEY,
            client text NOT NULL,
            at timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute("CREATE INDEX smtp_auth_failures_client_idx ON smtp_auth_failures "
               "(client, at)")
    op.execute("CREATE INDEX smtp_auth_failures_at_idx ON smtp_auth_failures (at)")
    op.execute("""
        CREATE TABLE smtp_reply_counts (
            outcome text NOT NULL,
            code text NOT NULL,
            n bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (outcome, code)
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE smtp_reply_counts")
    op.execute("DROP TABLE smtp_auth_failures")
