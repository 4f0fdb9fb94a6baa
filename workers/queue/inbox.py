"""The failed-jobs inbox: retry or dismiss the problem jobs an admin chose."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    ACTIVE,
    PENDING,
    PROBLEM,
    Campaign,
    sql_list,
)

# --- inbox actions -------------------------------------------------------------------
# Failed and bounced jobs not dismissed: what an admin may retry or dismiss (the inbox's
# read queries are in webapp/domain/queue_reads.py).

@dataclass
class ProblemFilter:
    """Which failed/bounced jobs an inbox view (or "retry all matching") is about."""

    kind: str | None = None
    campaign_id: int | None = None
    error_class: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    email: str | None = None
    correlation_id: str | None = None
    job_id: int | None = None
    job_ids: list[int] | None = None  # the jobs an admin chose on the page

    def where(self) -> tuple[str, dict[str, Any]]:
        """SQL conditions on ``j`` (built from fixed fragments; values are bound), so the
        planner sees exactly the predicates of delivery_jobs_problem_*_idx."""
        clauses = [f"j.status IN {sql_list(PROBLEM)}", "j.dismissed_at IS NULL"]
        params: dict[str, Any] = {}
        for name, clause in (
                ("kind", "j.kind = :kind"), ("campaign_id", "j.campaign_id = :campaign_id"),
                ("error_class", "j.last_error_class = :error_class"),
                ("since", "j.finished_at >= :since"), ("until", "j.finished_at < :until"),
                ("email", "lower(j.email) = lower(:email)"),
                ("correlation_id", "j.correlation_id = CAST(:correlation_id AS uuid)"),
                ("job_id", "j.id = :job_id"),
                ("job_ids", "j.id = ANY(CAST(:job_ids AS bigint[]))")):
            value = getattr(self, name)
            if value is not None and value != "":
                clauses.append(clause)
                params[name] = value
        return " AND ".join(clauses), params


# The campaigns a retry touches, locked (in id order) before any job changes: completion
# locks the same rows, so the two are serialized on the campaign and a campaign is never
# left `sent` with pending jobs (P8).
_LOCK_RETRY_CAMPAIGNS = """
SELECT c.id FROM campaigns c
 WHERE c.id IN (SELECT j.campaign_id FROM delivery_jobs j
                 WHERE {where} AND j.finished_at <= :as_of AND j.campaign_id IS NOT NULL)
 ORDER BY c.id FOR UPDATE OF c
"""

# Retry, set-based and safe to repeat: the jobs go back to `pending` with a fresh schedule
# (due now; the schedule restarts at retry_base, the attempt numbers go on, the
# job_attempts rows stay). The UPDATE re-checks the status under the row lock, so two
# clicks (or two admins) retry each job once: the second finds it `pending` and skips it.
# Only jobs finished by `as_of` (when the page was shown) are touched, so a job that
# failed again since is not retried behind the admin's back. Left out and reported, never
# silently skipped: suppressed addresses, cancelled campaigns, and jobs whose user already
# has a live job of the same kind (one live job per user and kind; of several failed jobs
# of one user only the newest is retried). A `sent` campaign that gets jobs back is
# `sending` again until they finish (P8).
_RETRY_PROBLEMS = f"""
WITH candidates AS (
    SELECT j.id, j.kind, j.email, j.campaign_id, c.status AS campaign_status,
           EXISTS (SELECT 1 FROM suppressions s WHERE s.email = lower(j.email)) AS suppressed,
           j.user_ref IS NOT NULL AND (
               EXISTS (SELECT 1 FROM delivery_jobs l
                        WHERE l.kind = j.kind AND l.user_ref = j.user_ref
                          AND l.status IN {{active}})
               OR row_number() OVER (PARTITION BY j.kind, j.user_ref
                                     ORDER BY j.finished_at DESC, j.id DESC) > 1) AS busy
      FROM delivery_jobs j LEFT JOIN campaigns c ON c.id = j.campaign_id
     WHERE {{where}} AND j.finished_at <= :as_of
), retried AS (
    UPDATE delivery_jobs j
       SET status = '{PENDING}', retry_base = j.attempts, available_at = now(),
           finished_at = NULL, dismissed_at = NULL, claimed_by = NULL, claim_token = NULL,
           claimed_at = NULL
      FROM candidates x
     WHERE j.id = x.id AND NOT x.suppressed AND NOT x.busy
       AND x.campaign_status IS DISTINCT FROM 'cancelled'
       AND j.status IN {{problem}} AND j.dismissed_at IS NULL
    RETURNING j.id, j.kind, j.campaign_id
), reopened AS (
    -- finished_at stays: the campaign first finished then, whatever is retried later.
    UPDATE campaigns SET status = '{Campaign.SENDING}', updated_at = now()
     WHERE id IN (SELECT campaign_id FROM retried) AND status = '{Campaign.SENT}'
    RETURNING broadcast_id
), unfinished AS (
    UPDATE broadcasts SET finished_at = NULL WHERE id IN (SELECT broadcast_id FROM reopened)
)
SELECT (SELECT count(*) FROM retried) AS retried,
       (SELECT coalesce(array_agg(DISTINCT kind), '{{{{}}}}') FROM retried) AS kinds,
       (SELECT count(*) FROM candidates WHERE suppressed) AS suppressed,
       (SELECT coalesce(array_agg(email ORDER BY email), '{{{{}}}}') FROM (
            SELECT email FROM candidates WHERE suppressed ORDER BY email LIMIT 5) e)
           AS suppressed_examples,
       (SELECT count(*) FROM candidates
         WHERE campaign_status = '{Campaign.CANCELLED}') AS cancelled,
       (SELECT count(*) FROM candidates WHERE busy AND NOT suppressed) AS busy
"""


def retry_problem_jobs(conn: Connection, where: ProblemFilter,
                       as_of: datetime) -> dict[str, Any]:
    """Retry every open problem matching ``where`` that finished by ``as_of``; returns
    ``retried``, ``kinds``, ``suppressed`` (+ ``suppressed_examples``), ``cancelled`` and
    ``busy`` (left out: the user has a live job of that kind)."""
    sql, params = where.where()
    conn.execute(sa.text(_LOCK_RETRY_CAMPAIGNS.format(where=sql)), {**params, "as_of": as_of})
    row = conn.execute(sa.text(_RETRY_PROBLEMS.format(where=sql, problem=sql_list(PROBLEM),
                                                      active=sql_list(ACTIVE))),
                       {**params, "as_of": as_of}).mappings().one()
    return dict(row)


# Dismiss: the job leaves the inbox (its state and history stay as they are).
_DISMISS = sa.text(f"""
UPDATE delivery_jobs SET dismissed_at = now()
 WHERE id = :id AND status IN {sql_list(PROBLEM)} AND dismissed_at IS NULL
RETURNING id, email, status
""")


def dismiss_job(conn: Connection, job_id: int) -> dict[str, Any] | None:
    row = conn.execute(_DISMISS, {"id": job_id}).mappings().first()
    return dict(row) if row else None
