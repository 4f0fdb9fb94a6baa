"""import_uploads: a CSV file checked first (dry run, column mapping) waits here, not in
one web host's temporary directory, so any web process can import it; rows expire.

Revision ID: 0020
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "import_uploads",
        sa.Column("token", sa.Text, primary_key=True),
        sa.Column("list_id", sa.BigInteger, sa.ForeignKey("lists.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("import_uploads_expires_idx", "import_uploads", ["expires_at"])
    # The file in pieces of a MiB: neither keeping nor reading it holds a whole upload
    # (up to SENDDOCK_MAX_IMPORT_BYTES) in memory.
    op.create_table(
        "import_upload_chunks",
        sa.Column("token", sa.Text, sa.ForeignKey("import_uploads.token", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("token", "seq"),
    )


def downgrade() -> None:
    op.drop_table("import_upload_chunks")
    op.drop_table("import_uploads")
