"""Receiver reports: DMARC aggregate and failure reports and SMTP TLS reports,
their records, and the files that could not be read (docs/deliverability.md).

Revision ID: 0041_deliverability
Revises: 0037_bulk_class
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0041_deliverability"
down_revision = "0040_accounts"
branch_labels = None
depends_on = None


def _created() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                     server_default=sa.func.now())


def upgrade() -> None:
    op.create_table(
        "receiver_reports",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("org_name", sa.Text(), nullable=False),
        sa.Column("report_id", sa.Text(), nullable=False),
        sa.Column("domain", sa.Text(), nullable=False),
        sa.Column("begin_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("policy", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("detail", JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("warnings", JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("records", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("messages", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False, server_default=""),
        _created(),
        sa.CheckConstraint("kind IN ('aggregate', 'failure', 'smtp_tls')",
                           name="receiver_reports_kind_check"),
        sa.UniqueConstraint("org_name", "report_id", name="receiver_reports_org_report_key"),
    )
    op.create_index("receiver_reports_domain_idx", "receiver_reports", ["domain", "begin_at"])
    op.create_index("receiver_reports_created_idx", "receiver_reports", ["created_at"])
    op.create_table(
        "receiver_report_records",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("report", sa.BigInteger(),
                  sa.ForeignKey("receiver_reports.id", ondelete="CASCADE"), nullable=False),
        sa.Column("domain", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("reporter", sa.Text(), nullable=False),
        sa.Column("source_ip", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("disposition", sa.Text(), nullable=False),
        sa.Column("dkim", sa.Text(), nullable=False),
        sa.Column("spf", sa.Text(), nullable=False),
        sa.Column("header_from", sa.Text(), nullable=False, server_default=""),
        sa.Column("envelope_from", sa.Text()),
        sa.Column("auth", JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
    )
    op.create_index("receiver_report_records_domain_day_idx", "receiver_report_records",
                    ["domain", "day"])
    op.create_index("receiver_report_records_report_idx", "receiver_report_records",
                    ["report"])
    op.create_table(
        "receiver_tls_policies",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("report", sa.BigInteger(),
                  sa.ForeignKey("receiver_reports.id", ondelete="CASCADE"), nullable=False),
        sa.Column("policy_domain", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("reporter", sa.Text(), nullable=False),
        sa.Column("policy_type", sa.Text(), nullable=False),
        sa.Column("successful", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        sa.Column("details", JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
    )
    op.create_index("receiver_tls_policies_domain_day_idx", "receiver_tls_policies",
                    ["policy_domain", "day"])
    op.create_index("receiver_tls_policies_report_idx", "receiver_tls_policies", ["report"])
    op.create_table(
        "receiver_report_rejects",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("digest", sa.Text(), nullable=False, unique=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("filename", sa.Text(), nullable=False, server_default=""),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        _created(),
    )
    op.create_index("receiver_report_rejects_created_idx", "receiver_report_rejects",
                    ["created_at"])


def downgrade() -> None:
    op.drop_table("receiver_report_rejects")
    op.drop_table("receiver_tls_policies")
    op.drop_table("receiver_report_records")
    op.drop_table("receiver_reports")
