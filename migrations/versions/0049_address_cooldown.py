"""address cooldown: no two emails of a kind with a cooldown to one address (lower-cased,
any user id) inside each other's cooldown, under any concurrency. The enqueue statement
looked the address's last job up, but statements running at the same moment read before
each other had committed, so a burst of sign-ups naming one mailbox sent it several
emails. Each such job now records the end of the cooldown it opened (``cooldown_until``:
its creation plus the cooldown it was asked with), and an exclusion constraint refuses a
second job whose cooldown overlaps: the losing statement inserts nothing, answers
``busy``, and its caller's next round finds the winner (docs/design.md §21).

The constraint compares a 64-bit hash of the kind and the address, not the two texts:
its check costs each such insert half as much (measured: 80 -> 40 µs of PostgreSQL
time), and two addresses would have to collide in 64 bits with their cooldowns open at
once to refuse each other (a ``busy`` answer, never a lost message).

Jobs enqueued before this revision have no ``cooldown_until`` and are not in the
constraint; the lookup still covers them. Adding the constraint scans the jobs table once
(only jobs asked with a cooldown enter its index).

Revision ID: 0049_address_cooldown
Revises: 0048_guard_database
"""

from __future__ import annotations

from alembic import op

revision = "0049_address_cooldown"
down_revision = "0048_guard_database"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE delivery_jobs ADD COLUMN cooldown_until timestamptz")
    op.execute("""
        ALTER TABLE delivery_jobs ADD CONSTRAINT delivery_jobs_cooldown_excl
        EXCLUDE USING gist (hashtextextended(kind || ' ' || lower(email), 0) WITH =,
                            tstzrange(created_at, cooldown_until) WITH &&)
        WHERE (cooldown_until IS NOT NULL AND status <> 'cancelled')""")


def downgrade() -> None:
    op.execute("ALTER TABLE delivery_jobs DROP CONSTRAINT delivery_jobs_cooldown_excl")
    op.execute("ALTER TABLE delivery_jobs DROP COLUMN cooldown_until")
