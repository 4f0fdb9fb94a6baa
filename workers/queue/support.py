"""Transactional mail for one user (docs/design.md §21): the support tools (resend, hurry,
release or drop a held message) and the waiting jobs of a transactional kind."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    CANCELLED,
    CLAIMABLE,
    HELD,
    PENDING,
    RETRY,
    SENDING,
    SENT,
    WAITING,
    sql_list,
)
from workers.queue.common import JOB_COLUMNS, notify_new_jobs

# --- verification ----------------------------------------------------------------------
# Transactional mail for one user of the team's SaaS (docs/design.md §21). "Live" means not
# terminal: pending, sending, retry or held; the partial unique index delivery_jobs_one_active_idx
# keeps it to one live job per (kind, user).


def lock_user(conn: Connection, kind: str, user_ref: str) -> None:
    """Serialize requests for one (kind, user) until the caller's transaction ends, so the
    cooldown check and the insert that follows it cannot interleave with another request.
    (The two-key form lives in a key space apart from the workers' bigint liveness locks.)"""
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(7, hashtext(:kind || ':' || :user_ref))"),
                 {"kind": kind, "user_ref": user_ref})


# The user's most recent job and how many seconds of resend cooldown are left (0 when none),
# measured on the database clock from the latest of: the job's creation, its acceptance by
# the relay, and the last resend that reused it.
_LATEST_JOB_FOR_USER = sa.text(f"""
SELECT {JOB_COLUMNS},
       greatest(0, extract(epoch FROM greatest(
           created_at,
           CASE WHEN status = '{SENT}' THEN finished_at END,
           CAST(payload ->> 'resent_at' AS timestamptz))
         + make_interval(secs => :cooldown) - now()))::float8 AS cooldown_left,
       greatest(created_at, CASE WHEN status = '{SENT}' THEN finished_at END,
                CAST(payload ->> 'resent_at' AS timestamptz))
         + make_interval(secs => :cooldown) AS cooldown_until
  FROM delivery_jobs
 WHERE kind = :kind AND user_ref = :user_ref
 ORDER BY created_at DESC, id DESC LIMIT 1
""")


def latest_job_for_user(conn: Connection, kind: str, user_ref: str,
                        cooldown: float) -> dict[str, Any] | None:
    """The newest job for the user, with ``cooldown_left`` (seconds) and
    ``cooldown_until`` for a resend cooldown of ``cooldown`` seconds; None if there is none."""
    row = conn.execute(_LATEST_JOB_FOR_USER, {"kind": kind, "user_ref": user_ref,
                                              "cooldown": cooldown}).mappings().first()
    return dict(row) if row else None


# A resend that reuses the live job: a waiting (pending/retry) job becomes due now, at the
# priority of a single request of its kind (an imported one no longer waits behind the rest
# of its import: states.BULK_STEP); the resend time is stamped on every live job so the
# cooldown restarts. Held jobs are left to release/drop. Returns nothing when the job is no
# longer live.
_MARK_RESENT = sa.text(f"""
UPDATE delivery_jobs
   SET available_at = CASE WHEN status IN {sql_list(CLAIMABLE)} THEN now() ELSE available_at END,
       priority = CASE WHEN status IN {sql_list(CLAIMABLE)} THEN least(priority, :priority)
                       ELSE priority END,
       payload = payload || jsonb_build_object(
           'resent_at', now(), 'resends', coalesce((payload ->> 'resends')::int, 0) + 1)
 WHERE id = :id AND status IN {sql_list((*CLAIMABLE, SENDING))}
RETURNING {JOB_COLUMNS}
""")


# A waiting job asked for again by a single request (the user is waiting for it now): at
# that request's priority if it was imported (states.BULK_STEP). Only a job still waiting
# moves; nothing else about it changes.
_HURRY = sa.text(f"""
UPDATE delivery_jobs SET priority = :priority
 WHERE id = :id AND priority > :priority AND status IN {sql_list(CLAIMABLE)}
""")


def hurry(conn: Connection, job_id: int, priority: int) -> None:
    conn.execute(_HURRY, {"id": job_id, "priority": priority})


def mark_resent(conn: Connection, job_id: int, priority: int) -> dict[str, Any] | None:
    """``priority``: the kind's, a single request's."""
    row = conn.execute(_MARK_RESENT, {"id": job_id, "priority": priority}).mappings().first()
    return dict(row) if row else None


# Release a held job: it becomes `pending` and due now. Only a job still `held` moves, so
# two support people clicking at once release it once.
_RELEASE_HELD = sa.text(f"""
UPDATE delivery_jobs SET status = '{PENDING}', available_at = now()
 WHERE id = :id AND kind = :kind AND status = '{HELD}'
RETURNING {JOB_COLUMNS}
""")


def release_held(conn: Connection, job_id: int,
                 kind: str = "verification") -> dict[str, Any] | None:
    row = conn.execute(_RELEASE_HELD, {"id": job_id, "kind": kind}).mappings().first()
    return dict(row) if row else None


# Drop a held job: terminal `cancelled`, with the reason kept as its last error. Only a job
# still `held` moves.
_DROP_HELD = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{CANCELLED}', finished_at = now(), last_error = :reason,
       last_error_class = 'dropped'
 WHERE id = :id AND kind = :kind AND status = '{HELD}'
RETURNING {JOB_COLUMNS}
""")


def drop_held(conn: Connection, job_id: int, reason: str,
              kind: str = "verification") -> dict[str, Any] | None:
    row = conn.execute(_DROP_HELD, {"id": job_id, "kind": kind, "reason": reason}
                       ).mappings().first()
    return dict(row) if row else None


# --- transactional kinds (docs/design.md §21) -----------------------------------------------------
# Cancel what is still waiting for one (kind, user): pending (scheduled or due), retry and
# held messages end `cancelled`; a message being sent right now is left to finish. The
# status guard makes two concurrent cancels cancel each message once.
_CANCEL_WAITING = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{CANCELLED}', finished_at = now(), last_error = :reason,
       last_error_class = '{CANCELLED}'
 WHERE kind = :kind AND user_ref = :user_ref AND status IN {sql_list(WAITING)}
RETURNING id
""")


def cancel_waiting(conn: Connection, kind: str, user_ref: str, reason: str) -> list[int]:
    """Ids of the messages cancelled (oldest first)."""
    return sorted(int(r.id) for r in conn.execute(_CANCEL_WAITING, {
        "kind": kind, "user_ref": user_ref, "reason": reason[:500]}))


# An admin's bulk actions on chosen jobs (the jobs browser, as Oban Web's): cancel those
# still waiting, retrying or held (a job already claimed finishes as it is, like a campaign
# cancel); or make retrying ones due now. Each re-checks the state under the row lock, so a
# job that moved on since the page was shown is left alone (and counted as not changed).
_CANCEL_CHOSEN = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{CANCELLED}', finished_at = now(), last_error = :reason,
       last_error_class = '{CANCELLED}', claimed_by = NULL, claim_token = NULL
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status IN {sql_list((*CLAIMABLE, HELD))}
RETURNING id
""")
_RETRY_CHOSEN_NOW = sa.text(f"""
UPDATE delivery_jobs SET available_at = now()
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status = '{RETRY}' AND available_at > now()
RETURNING id
""")


def cancel_chosen(conn: Connection, job_ids: Sequence[int], reason: str) -> list[int]:
    """Cancel the chosen jobs that are waiting, retrying or held; returns those cancelled."""
    return [int(i) for i in conn.execute(_CANCEL_CHOSEN, {"ids": list(job_ids),
                                                          "reason": reason}).scalars()]


def retry_chosen_now(conn: Connection, job_ids: Sequence[int]) -> list[int]:
    """Make the chosen retrying jobs due now (their attempt count is kept)."""
    ids = [int(i) for i in conn.execute(_RETRY_CHOSEN_NOW, {"ids": list(job_ids)}).scalars()]
    if ids:
        notify_new_jobs(conn, "retry")
    return ids


_IN_FLIGHT_FOR_USER = sa.text(f"""
SELECT count(*) FROM delivery_jobs
 WHERE kind = :kind AND user_ref = :user_ref AND status = '{SENDING}'
""")


def in_flight_for_user(conn: Connection, kind: str, user_ref: str) -> int:
    return int(conn.execute(_IN_FLIGHT_FOR_USER, {"kind": kind, "user_ref": user_ref})
               .scalar_one())
