"""send guard: a pause or cancel waiting in another database no longer stops this one's
messages. Advisory locks are per database, but ``pg_locks`` lists every database's, and
``senddock_send_guard`` (migration 0042) looked for a waiter by key alone: two SendDock
databases on one server, each with a campaign of the same id, stopped each other's
messages while one of them paused. The waiter is now looked for in the current database
only (``stop_sending``'s count of messages in flight likewise, in
workers/delivery/lifecycle.py).

Revision ID: 0048_guard_database
Revises: 0047_import_check
"""

from __future__ import annotations

from alembic import op

revision = "0048_guard_database"
down_revision = "0047_import_check"
branch_labels = None
depends_on = None


def _guard(this_database_only: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION senddock_send_guard(campaign bigint, lock_key bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ok boolean;
BEGIN
    -- A pause or cancel waiting for the exclusive lock: no new message. (This session may
    -- hold the shared lock for another thread's message already, and a session's own
    -- request would then be granted at once, past the waiter.)
    IF EXISTS (SELECT 1 FROM pg_locks
                WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
                  AND classid = CAST(lock_key >> 32 AS oid)
                  AND objid = CAST(lock_key & 4294967295 AS oid){this_database_only}) THEN
        RETURN false;
    END IF;
    IF NOT pg_try_advisory_lock_shared(lock_key) THEN
        RETURN false;
    END IF;
    SELECT status = 'sending' INTO ok FROM campaigns WHERE id = campaign;
    IF ok IS NOT TRUE THEN
        PERFORM pg_advisory_unlock_shared(lock_key);
        RETURN false;
    END IF;
    RETURN true;
END $$
"""


def upgrade() -> None:
    op.execute(_guard("\n                  AND database = (SELECT oid FROM pg_database\n"
                      "                                   WHERE datname = current_database())"))


def downgrade() -> None:
    op.execute(_guard(""))
