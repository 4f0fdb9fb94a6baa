"""delivery_jobs refuses an illegal status move: a row trigger whose WHEN clause is the
job vocabulary's TRANSITIONS (workers/core/states.py), so PostgreSQL itself refuses e.g.
`UPDATE delivery_jobs SET status = 'pending' WHERE status = 'sent'` (SQLSTATE 23514).

A legal move never calls the function: the WHEN clause is evaluated per updated row in
the executor and is false for every legal move; only an illegal one reaches the plpgsql
function, which raises. Rows whose status does not change (and statements that do not set
``status``) are not looked at.

The moves are frozen here, as a migration's schema must be: when TRANSITIONS changes, a
new migration replaces this trigger (tests/unit/test_layout.py checks that TRANSITIONS and
the latest trigger's moves agree; tests/integration/test_job_transitions.py tries every
pair of states against the database).

Revision ID: 0021_arch
Revises: 0021
"""

from __future__ import annotations

from alembic import op

revision = "0021_arch"
down_revision = "0021"
branch_labels = None
depends_on = None

#: workers.core.states.TRANSITIONS as of this revision: old status -> the statuses it may
#: move to.
MOVES: dict[str, tuple[str, ...]] = {
    "pending": ("sending", "skipped", "cancelled"),
    "sending": ("sent", "failed", "bounced", "retry", "pending", "skipped"),
    "retry": ("sending", "pending", "skipped", "cancelled", "failed"),
    "held": ("pending", "cancelled", "skipped"),
    "sent": ("bounced",),
    "failed": ("pending",),
    "bounced": ("pending",),
    "skipped": (),
    "cancelled": (),
}


def legal_move_sql(moves: dict[str, tuple[str, ...]]) -> str:
    """``CASE OLD.status WHEN 'pending' THEN NEW.status IN (...) ... ELSE false END``."""
    arms = "\n".join(
        f"         WHEN '{old}' THEN NEW.status IN ({', '.join(repr(n) for n in new)})"
        for old, new in moves.items() if new)
    return f"CASE OLD.status\n{arms}\n         ELSE false END"


def upgrade() -> None:
    op.execute("""
    CREATE FUNCTION senddock_refuse_job_move() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      RAISE EXCEPTION 'delivery job %: % -> % is not a legal move', OLD.id, OLD.status,
                      NEW.status
        USING ERRCODE = 'check_violation', CONSTRAINT = 'delivery_jobs_legal_move',
              HINT = 'the legal moves are workers/core/states.py TRANSITIONS';
    END $$
    """)
    op.execute(f"""
    CREATE TRIGGER delivery_jobs_legal_move BEFORE UPDATE OF status ON delivery_jobs
       FOR EACH ROW
       WHEN (OLD.status IS DISTINCT FROM NEW.status AND NOT ({legal_move_sql(MOVES)}))
       EXECUTE FUNCTION senddock_refuse_job_move()
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS delivery_jobs_legal_move ON delivery_jobs")
    op.execute("DROP FUNCTION IF EXISTS senddock_refuse_job_move()")
