"""SMTP submission: the raw messages clients submit, stored once per message and
referenced by its jobs (``payload.data.smtp_message_id``, signed), and a token's default kind.

Revision ID: 0038_smtp_submission
Revises: 0037_bulk_class
"""

from __future__ import annotations

from alembic import op

revision = "0038_smtp_submission"
down_revision = "0037_bulk_class"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE smtp_messages (
            id bigserial PRIMARY KEY,
            token_id bigint REFERENCES api_tokens(id) ON DELETE SET NULL,
            message_id text NOT NULL DEFAULT '',
            mail_from text NOT NULL DEFAULT '',
            client text NOT NULL DEFAULT '',
            size integer NOT NULL,
            raw bytea NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute("CREATE INDEX smtp_messages_created_idx ON smtp_messages (created_at)")
    op.execute("ALTER TABLE smtp_messages ALTER COLUMN raw SET STORAGE EXTERNAL")
    op.execute("ALTER TABLE api_tokens ADD COLUMN default_kind text")


def downgrade() -> None:
    op.execute("ALTER TABLE api_tokens DROP COLUMN default_kind")
    op.execute("DROP TABLE smtp_messages")
