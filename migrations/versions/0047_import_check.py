"""import check: a kept upload belongs to the account that checked it, one per (account,
list): ``import_uploads.owner_id`` (``users.id``, deleted with the account) and a unique
index on (owner_id, list_id). Checking a file again replaces the account's previous one for
that list (docs/design.md §35).

Uploads kept before this revision name no owner; they wait at most an hour and are deleted
here (with their chunks): whoever was checking one uploads it again.

Revision ID: 0047_import_check
Revises: 0046_bounce_rules
"""

from __future__ import annotations

from alembic import op

revision = "0047_import_check"
down_revision = "0046_bounce_rules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM import_uploads")
    op.execute("ALTER TABLE import_uploads ADD COLUMN owner_id bigint NOT NULL "
               "REFERENCES users (id) ON DELETE CASCADE")
    op.execute("CREATE UNIQUE INDEX import_uploads_owner_list_key "
               "ON import_uploads (owner_id, list_id)")


def downgrade() -> None:
    op.execute("DROP INDEX import_uploads_owner_list_key")
    op.execute("ALTER TABLE import_uploads DROP COLUMN owner_id")
