"""sequences: welcome series and drips

- ``sequences``: a trigger (a list's add or confirmation, or an event name), an optional
  goal event, re-entry (once ever, or again after N days) and a status
  (active, paused, archived).
- ``sequence_steps``: ordered steps of type email, wait or condition; a removed step keeps
  its row (``removed_at``) so the visits that name it still read.
- ``sequence_enrollments``: one person's way through one sequence: the step it is at and
  when that step is due by the database's clock. The advancer reads the due ones from
  ``sequence_enrollments_due_idx`` (active ones only), never the whole table.
- ``sequence_visits``: one row per (enrollment, step) the advancer performed: its job (for
  an email step), when, and the outcome. Its primary key is the step's at-most-once rule
  beside the job's own (``delivery_jobs.idempotency_key`` ``seq:<enrollment>:<step>``).
- ``events``: what the team's app posted (``POST /api/v1/events``).

Triggers on ``memberships`` (statement level, set-based: an import of a million adds one
statement) and on ``subscription_requests`` (a confirmation) enrol in the same transaction
as the add, through ``senddock_enrol_candidates``'s re-entry rule.

Revision ID: 0039_sequences
Revises: 0037_bulk_class
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0039_sequences"
down_revision = "0038_smtp_submission"
branch_labels = None
depends_on = None

# Enrol the (sequence, subscriber, data) candidates of the CTE `cand` (this text follows
# it), keeping each sequence's re-entry rule; the partial unique index keeps one open
# enrollment per person and sequence under any concurrency. The sequences' first steps and
# the pairs the rule blocks are materialized first: a per-row probe of the table being
# inserted into read its growing heap again for every row (quadratic: 5 s for 20,000).
ENROL = """
, q AS MATERIALIZED (
    SELECT s.id, s.reentry_days,
           CASE WHEN s.status = 'paused' THEN 'paused' ELSE 'active' END AS state,
           (SELECT st.id FROM sequence_steps st WHERE st.sequence_id = s.id
               AND st.removed_at IS NULL ORDER BY st.position, st.id LIMIT 1) AS first_step
      FROM sequences s
     WHERE s.status <> 'archived' AND s.id IN (SELECT sequence_id FROM cand)
), blocked AS MATERIALIZED (
    SELECT c.sequence_id, c.subscriber_id
      FROM cand c JOIN q ON q.id = c.sequence_id
     WHERE EXISTS (
           SELECT 1 FROM sequence_enrollments e
            WHERE e.subscriber_id = c.subscriber_id AND e.sequence_id = c.sequence_id
              AND (e.status IN ('active', 'paused') OR q.reentry_days IS NULL
                   OR e.entered_at > now() - make_interval(days => q.reentry_days)))
)
INSERT INTO sequence_enrollments (sequence_id, subscriber_id, status, step_id, due_at, data)
SELECT c.sequence_id, c.subscriber_id, q.state, q.first_step, now(), c.data
  FROM cand c JOIN q ON q.id = c.sequence_id
  LEFT JOIN blocked b ON b.sequence_id = c.sequence_id AND b.subscriber_id = c.subscriber_id
 WHERE b.sequence_id IS NULL
ON CONFLICT DO NOTHING
"""

FUNCTIONS = [
    f"""
CREATE FUNCTION senddock_enrol_on_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM sequences WHERE trigger_type = 'list_add'
                      AND status <> 'archived') THEN
        RETURN NULL;
    END IF;
    WITH cand AS (
        SELECT s.id AS sequence_id, a.subscriber_id, '{{}}'::jsonb AS data
          FROM added a JOIN sequences s ON s.list_id = a.list_id
         WHERE s.trigger_type = 'list_add' AND s.status <> 'archived'
    )
    {ENROL};
    RETURN NULL;
END $$""",
    f"""
CREATE FUNCTION senddock_enrol_on_confirm() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH cand AS (
        SELECT s.id AS sequence_id, sub.id AS subscriber_id, '{{}}'::jsonb AS data
          FROM sequences s
          JOIN subscribers sub ON lower(sub.email) = lower(NEW.email)
          JOIN memberships m ON m.list_id = NEW.list_id AND m.subscriber_id = sub.id
         WHERE s.list_id = NEW.list_id AND s.trigger_type = 'list_confirm'
           AND s.status <> 'archived'
    )
    {ENROL};
    RETURN NULL;
END $$""",
    """
CREATE TRIGGER memberships_enrol AFTER INSERT ON memberships
REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION senddock_enrol_on_add()
""",
    """
CREATE TRIGGER subscription_requests_enrol AFTER UPDATE OF confirmed_at
ON subscription_requests FOR EACH ROW
WHEN (OLD.confirmed_at IS NULL AND NEW.confirmed_at IS NOT NULL)
EXECUTE FUNCTION senddock_enrol_on_confirm()
""",
]


def _now() -> sa.Column:  # type: ignore[type-arg]
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                     server_default=sa.text("now()"))


def upgrade() -> None:
    op.create_table(
        "sequences",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="active"),
        sa.Column("trigger_type", sa.Text, nullable=False),
        sa.Column("list_id", sa.BigInteger, sa.ForeignKey("lists.id", ondelete="CASCADE")),
        sa.Column("trigger_event", sa.Text),
        sa.Column("goal_event", sa.Text),
        sa.Column("reentry_days", sa.Integer),
        sa.Column("from_addr", sa.Text),
        sa.Column("layout_id", sa.BigInteger, sa.ForeignKey("layouts.id", ondelete="SET NULL")),
        _now(),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.CheckConstraint("status IN ('active', 'paused', 'archived')",
                           name="sequences_status_check"),
        sa.CheckConstraint("trigger_type IN ('list_add', 'list_confirm', 'event')",
                           name="sequences_trigger_type_check"),
        sa.CheckConstraint("(trigger_type = 'event') = (trigger_event IS NOT NULL) AND "
                           "(trigger_type = 'event') = (list_id IS NULL)",
                           name="sequences_trigger_check"),
        sa.CheckConstraint("reentry_days IS NULL OR reentry_days >= 0",
                           name="sequences_reentry_check"),
    )
    op.create_index("sequences_list_idx", "sequences", ["list_id"],
                    postgresql_where=sa.text("list_id IS NOT NULL"))
    op.create_index("sequences_event_idx", "sequences", ["trigger_event"],
                    postgresql_where=sa.text("trigger_event IS NOT NULL"))
    op.create_table(
        "sequence_steps",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("sequence_id", sa.BigInteger,
                  sa.ForeignKey("sequences.id", ondelete="CASCADE"), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("subject", sa.Text),
        sa.Column("text_body", sa.Text),
        sa.Column("html_body", sa.Text),
        sa.Column("wait_seconds", sa.Integer),
        sa.Column("window_start", sa.SmallInteger),
        sa.Column("window_end", sa.SmallInteger),
        sa.Column("condition", JSONB),
        sa.Column("if_false", sa.Text),
        sa.Column("skip", sa.Integer, nullable=False, server_default=sa.text("1")),
        sa.Column("version", sa.Integer, nullable=False, server_default=sa.text("1")),
        sa.Column("removed_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("type IN ('email', 'wait', 'condition')",
                           name="sequence_steps_type_check"),
        sa.CheckConstraint("type <> 'email' OR (subject IS NOT NULL AND "
                           "(text_body IS NOT NULL OR html_body IS NOT NULL))",
                           name="sequence_steps_email_check"),
        sa.CheckConstraint("type <> 'wait' OR wait_seconds >= 0",
                           name="sequence_steps_wait_check"),
        sa.CheckConstraint("(window_start IS NULL) = (window_end IS NULL) AND "
                           "(window_start IS NULL OR (window_start BETWEEN 0 AND 23 AND "
                           "window_end BETWEEN 0 AND 24 AND window_start <> window_end))",
                           name="sequence_steps_window_check"),
        sa.CheckConstraint("type <> 'condition' OR (condition IS NOT NULL AND "
                           "if_false IN ('skip', 'exit'))",
                           name="sequence_steps_condition_check"),
        sa.CheckConstraint("skip >= 1", name="sequence_steps_skip_check"),
    )
    op.create_index("sequence_steps_sequence_idx", "sequence_steps",
                    ["sequence_id", "position"])
    op.create_table(
        "sequence_enrollments",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("sequence_id", sa.BigInteger,
                  sa.ForeignKey("sequences.id", ondelete="CASCADE"), nullable=False),
        sa.Column("subscriber_id", sa.BigInteger,
                  sa.ForeignKey("subscribers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="active"),
        sa.Column("exit_reason", sa.Text),
        sa.Column("step_id", sa.BigInteger),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("data", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("entered_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('active', 'paused', 'done', 'exited')",
                           name="sequence_enrollments_status_check"),
        sa.CheckConstraint("(status = 'exited') = (exit_reason IS NOT NULL)",
                           name="sequence_enrollments_exit_check"),
    )
    op.create_index("sequence_enrollments_due_idx", "sequence_enrollments", ["due_at", "id"],
                    postgresql_where=sa.text("status = 'active'"))
    op.create_index("sequence_enrollments_open_idx", "sequence_enrollments",
                    ["sequence_id", "subscriber_id"], unique=True,
                    postgresql_where=sa.text("status IN ('active', 'paused')"))
    op.create_index("sequence_enrollments_subscriber_idx", "sequence_enrollments",
                    ["subscriber_id", "sequence_id", "entered_at"])
    op.create_index("sequence_enrollments_step_idx", "sequence_enrollments", ["step_id"],
                    postgresql_where=sa.text("status IN ('active', 'paused')"))
    op.create_table(
        "sequence_visits",
        sa.Column("enrollment_id", sa.BigInteger,
                  sa.ForeignKey("sequence_enrollments.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("step_id", sa.BigInteger,
                  sa.ForeignKey("sequence_steps.id", ondelete="CASCADE"), nullable=False),
        sa.Column("job_id", sa.BigInteger),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("enrollment_id", "step_id"),
    )
    op.create_index("sequence_visits_step_idx", "sequence_visits", ["step_id", "outcome"])
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("subscriber_id", sa.BigInteger,
                  sa.ForeignKey("subscribers.id", ondelete="CASCADE")),
        sa.Column("user_ref", sa.Text),
        sa.Column("email", sa.Text),
        sa.Column("data", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
    )
    op.create_index("events_subscriber_idx", "events", ["subscriber_id", "name", "at"])
    op.create_index("events_user_idx", "events", ["user_ref", "at"],
                    postgresql_where=sa.text("user_ref IS NOT NULL"))
    for statement in FUNCTIONS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TRIGGER subscription_requests_enrol ON subscription_requests")
    op.execute("DROP TRIGGER memberships_enrol ON memberships")
    op.execute("DROP FUNCTION senddock_enrol_on_confirm()")
    op.execute("DROP FUNCTION senddock_enrol_on_add()")
    for table in ("events", "sequence_visits", "sequence_enrollments", "sequence_steps",
                  "sequences"):
        op.drop_table(table)
