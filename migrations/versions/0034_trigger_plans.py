"""trigger plans: the two statement triggers that join a statement's new rows to
its old ones are planned without nested loops

PL/pgSQL plans a trigger's statement once per session and keeps that plan (the statement
has no parameters, so PostgreSQL never replans it for the transition tables' real sizes).
In `senddock serve` the first update of a session is a finish of a few jobs, so the join of
``new_rows`` to ``old_rows`` was planned as a nested loop, and every later 10,000-job settle
chunk of a cancelled campaign compared 10,000 x 10,000 rows in the trigger: 34-38 s a chunk
on the 10M table (auto_explain), a live settle of 500 jobs/s. With nested loops off for
these two functions the join is hashed at any size (15,000 jobs/s live on the same table).

Revision ID: 0034_trigger_plans
Revises: 0032_scale3
"""

from __future__ import annotations

from alembic import op

revision = "0034_trigger_plans"
down_revision = "0032_scale3"
branch_labels = None
depends_on = None

#: The statement triggers whose statement joins new_rows to old_rows.
JOINING_TRIGGERS = ("senddock_count_outcomes", "senddock_job_events_out")


def upgrade() -> None:
    for name in JOINING_TRIGGERS:
        op.execute(f"ALTER FUNCTION {name}() SET enable_nestloop = off")


def downgrade() -> None:
    for name in JOINING_TRIGGERS:
        op.execute(f"ALTER FUNCTION {name}() RESET enable_nestloop")
