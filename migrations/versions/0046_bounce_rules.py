"""bounce rules: an admin's correction of a bounce's reading, kept as a rule (a reply
pattern → a reason) that decides later bounces from every source; ``job_events`` says which
rule decided an event and when an admin corrected it (docs/design.md §36).

Revision ID: 0046_bounce_rules
Revises: 0045_tracking_consent
"""

from __future__ import annotations

from alembic import op

revision = "0046_bounce_rules"
down_revision = "0045_tracking_consent"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE bounce_rules (
            id bigserial PRIMARY KEY,
            pattern text NOT NULL,
            reason text NOT NULL,
            note text NOT NULL DEFAULT '',
            created_by text NOT NULL DEFAULT '',
            from_event_id bigint,
            hits bigint NOT NULL DEFAULT 0,
            last_hit_at timestamptz,
            created_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT bounce_rules_pattern_check
                CHECK (char_length(pattern) BETWEEN 3 AND 500)
        )""")
    op.execute("CREATE UNIQUE INDEX bounce_rules_pattern_key ON bounce_rules (lower(pattern))")
    op.execute("ALTER TABLE job_events ADD COLUMN rule_id bigint "
               "REFERENCES bounce_rules (id) ON DELETE SET NULL")
    op.execute("ALTER TABLE job_events ADD COLUMN corrected_at timestamptz")
    op.execute("ALTER TABLE job_events ADD COLUMN read_as text")


def downgrade() -> None:
    op.execute("ALTER TABLE job_events DROP COLUMN read_as")
    op.execute("ALTER TABLE job_events DROP COLUMN corrected_at")
    op.execute("ALTER TABLE job_events DROP COLUMN rule_id")
    op.execute("DROP TABLE bounce_rules")
