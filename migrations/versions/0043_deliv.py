"""DMARC per-day summary (docs/design.md §30): what the domain page and the DMARC alarm read.

``dmarc_daily`` holds, per sending domain, day, reporter, source IP, disposition and the
policy the receiver applied (p, sp, pct; '' when the report left it out), the messages
reported and of them those passing DMARC, SPF-aligned and DKIM-aligned.
``dmarc_daily_reports`` holds how many aggregate reports each reporter sent per domain and
day. Both are kept in the transaction that stores a report's records
(``workers.after_acceptance.receiver_reports.store``), so they always equal the records;
the upgrade fills them from the records already stored.

Warm-up (docs/design.md §33): ``warmups`` holds the sending domains in warm-up, since which
day, their schedule of daily caps (NULL: the built-in ramp) and the share of a day's cap one
hour may use; ``warmup_sends`` counts, per domain and hour, the messages the pacer let out.

``receiver_report_rejects.reason_i18n`` keeps why a file was refused as message id and
parameters, so the page says it in the reader's language (NULL: only the English reason).

Revision ID: 0043_deliv
Revises: 0042_preferences
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0043_deliv"
down_revision = "0043_smtp"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dmarc_daily",
        sa.Column("domain", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("reporter", sa.Text(), nullable=False),
        sa.Column("source_ip", sa.Text(), nullable=False),
        sa.Column("disposition", sa.Text(), nullable=False),
        sa.Column("policy_p", sa.Text(), nullable=False),
        sa.Column("policy_sp", sa.Text(), nullable=False),
        sa.Column("policy_pct", sa.Text(), nullable=False),
        sa.Column("messages", sa.BigInteger(), nullable=False),
        sa.Column("dmarc_pass", sa.BigInteger(), nullable=False),
        sa.Column("spf_aligned", sa.BigInteger(), nullable=False),
        sa.Column("dkim_aligned", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("domain", "day", "reporter", "source_ip", "disposition",
                                "policy_p", "policy_sp", "policy_pct",
                                name="dmarc_daily_pkey"),
    )
    op.create_table(
        "dmarc_daily_reports",
        sa.Column("domain", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("reporter", sa.Text(), nullable=False),
        sa.Column("reports", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("domain", "day", "reporter", name="dmarc_daily_reports_pkey"),
    )
    op.create_table(
        "warmups",
        sa.Column("domain", sa.Text(), primary_key=True),
        sa.Column("started_on", sa.Date(), nullable=False),
        sa.Column("caps", sa.ARRAY(sa.Integer())),
        sa.Column("hour_share", sa.Float(), nullable=False, server_default="0.25"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.CheckConstraint("hour_share > 0 AND hour_share <= 1",
                           name="warmups_hour_share_check"),
    )
    op.create_table(
        "warmup_sends",
        sa.Column("domain", sa.Text(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sent", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("domain", "hour", name="warmup_sends_pkey"),
    )
    op.add_column("receiver_report_rejects", sa.Column("reason_i18n", JSONB()))
    op.execute("""
        INSERT INTO dmarc_daily
        SELECT c.domain, c.day, c.reporter, c.source_ip, c.disposition,
               coalesce(r.policy->>'p', ''), coalesce(r.policy->>'sp', ''),
               coalesce(r.policy->>'pct', ''), sum(c.count),
               coalesce(sum(c.count) FILTER (WHERE c.dkim = 'pass' OR c.spf = 'pass'), 0),
               coalesce(sum(c.count) FILTER (WHERE c.spf = 'pass'), 0),
               coalesce(sum(c.count) FILTER (WHERE c.dkim = 'pass'), 0)
          FROM receiver_report_records c JOIN receiver_reports r ON r.id = c.report
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8""")
    op.execute("""
        INSERT INTO dmarc_daily_reports
        SELECT domain, day, reporter, count(DISTINCT report) FROM receiver_report_records
         GROUP BY 1, 2, 3""")


def downgrade() -> None:
    op.drop_column("receiver_report_rejects", "reason_i18n")
    op.drop_table("warmup_sends")
    op.drop_table("warmups")
    op.drop_table("dmarc_daily_reports")
    op.drop_table("dmarc_daily")
