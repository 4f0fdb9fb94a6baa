"""subscriber preferences: leaving one list leaves the others

``list_unsubscribes`` keeps, per list and subscriber, that the person left the list (when,
how, from which campaign's message). Leaving deletes the membership, so no campaign of that
list reaches them, and nothing adds it back but a new confirmed consent (double opt-in),
which deletes the row. ``subscribers.locale`` is the language the person chose on their
preference page (NULL: never chosen).

Also ``senddock_send_guard(campaign, key)``: what a delivery thread calls
at the relay's 354, just before a campaign message goes out. It takes the campaign's shared
advisory lock without waiting (false while a pause or cancel holds or waits for the
exclusive one) and then reads the campaign's status with a fresh snapshot (a VOLATILE
function's statements each take their own), so a status committed before the lock was
granted is always seen. True (the lock kept until the message is answered) only while the
campaign is ``sending``. ``workers.delivery.lifecycle`` has both sides.

Revision ID: 0042_preferences
Revises: 0037_bulk_class
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0042_preferences"
down_revision = "0041_deliverability"
branch_labels = None
depends_on = None


GUARD = """
CREATE FUNCTION senddock_send_guard(campaign bigint, lock_key bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ok boolean;
BEGIN
    -- A pause or cancel waiting for the exclusive lock: no new message. (This session may
    -- hold the shared lock for another thread's message already, and a session's own
    -- request would then be granted at once, past the waiter.)
    IF EXISTS (SELECT 1 FROM pg_locks
                WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
                  AND classid = CAST(lock_key >> 32 AS oid)
                  AND objid = CAST(lock_key & 4294967295 AS oid)) THEN
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
    op.execute(GUARD)
    op.add_column("subscribers", sa.Column("locale", sa.Text()))
    op.create_table(
        "list_unsubscribes",
        sa.Column("list_id", sa.BigInteger(),
                  sa.ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
        sa.Column("subscriber_id", sa.BigInteger(),
                  sa.ForeignKey("subscribers.id", ondelete="CASCADE"), nullable=False),
        sa.Column("campaign_id", sa.BigInteger()),
        sa.Column("via", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("list_id", "subscriber_id"),
    )
    op.create_index("list_unsubscribes_subscriber_idx", "list_unsubscribes",
                    ["subscriber_id"])


def downgrade() -> None:
    op.execute("DROP FUNCTION senddock_send_guard(bigint, bigint)")
    op.drop_table("list_unsubscribes")
    op.drop_column("subscribers", "locale")
