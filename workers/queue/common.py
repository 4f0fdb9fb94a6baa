"""What several statements of the queue share: the suppression reason a hard bounce
writes, the job row as the API and the pages read it, and the per-transaction plan mode
of the chunk statements."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

#: The suppression reason a hard bounce writes (suppressions.reason, not a job state).
BOUNCE_REASON = "bounced"

#: The kind of a sequence's email step (workers.delivery.sequences).
SEQUENCE = "sequence"

# A job as the API and the pages read it: each field's name, and its expression where
# the column alone is not it.
JOB_FIELDS: dict[str, str] = {
    "id": "id", "kind": "kind", "status": "status", "email": "email",
    "user_ref": "user_ref", "correlation_id": "correlation_id::text", "flags": "flags",
    "payload": "payload", "attempts": "attempts", "available_at": "available_at",
    "created_at": "created_at", "finished_at": "finished_at", "last_error": "last_error",
    "last_error_class": "last_error_class", "requested_by": "requested_by",
    "idempotency_key": "idempotency_key", "message_id": "message_id"}


def job_columns(without: Sequence[str] = ()) -> str:
    """The select list of :data:`JOB_FIELDS`, less the fields ``without``."""
    return ", ".join(expression if expression == name else f"{expression} AS {name}"
                     for name, expression in JOB_FIELDS.items() if name not in without)


JOB_COLUMNS = job_columns()


def custom_plan(conn: Connection) -> None:
    """Plan this transaction's chunk statements for their own cursor values. psycopg
    prepares a statement run five times on a session, and PostgreSQL may then use one
    generic plan for every cursor: in the 1M bench some settle chunks took 40 s instead of
    1 s that way."""
    conn.execute(sa.text("SET LOCAL plan_cache_mode = force_custom_plan"))


def notify_new_jobs(conn: Connection, kind: str) -> None:
    """Wake idle workers at once (delivered at commit): P7's fast path."""
    conn.execute(sa.text("SELECT pg_notify('senddock_jobs', :kind)"), {"kind": kind})
