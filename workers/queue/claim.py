"""Claim: due jobs in priority order, marked ``sending`` under this worker's claim token
(docs/design.md §15, §16)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core import pg
from workers.core.jobs import ClaimedJob
from workers.core.states import (
    CLAIMABLE,
    PENDING,
    SENDING,
    Campaign,
    sql_list,
)

# --- claim -----------------------------------------------------------------------------

# Claim in one statement: due jobs in priority order (transactional kinds first, P7),
# skipping rows other workers hold (SKIP LOCKED), marked `sending` with this worker's id,
# the batch's claim token and the database clock at the claim (clock_timestamp(), not the
# transaction start: a claim that waited on a lock is as young as its commit). The caller
# registers the token as held *before* the statement runs, so the lost-claim release can
# never take back a claim in progress. Paused and cancelled campaigns are out of the claim
# path: the transactional jobs come from their own index, and each open broadcast whose
# campaign is `sending` (the lifecycle's one-row decision, workers.delivery.lifecycle) from its own
# range of delivery_jobs_broadcast_due_idx, so a paused or cancelled backlog of any size is
# never read, and a cancelled campaign's jobs not settled yet are never claimed. Nothing
# is claimed while every relay (``relays`` of them, docs/design.md §17) is marked down
# (P6) or has paused us (one relay up is enough: it carries the others' streams), nor
# for a recipient domain that is throttling us (docs/design.md §16: the other domains keep
# flowing).
# The Message-ID is fixed at the first claim and never changes (P3): random (it must not
# reveal volume) on the campaign's From domain.
_CLAIM = rf"""
WITH relay_up AS (
    SELECT EXISTS (SELECT 1 FROM relay_state r
                    WHERE r.id <= %(relays)s AND r.status <> 'down'
                      AND NOT coalesce(r.throttled_until > now(), false)) AS ok
), transactional AS (
    SELECT j.id, j.priority, j.available_at FROM delivery_jobs j
     WHERE j.status IN {sql_list(CLAIMABLE)} AND j.broadcast_id IS NULL
       AND j.available_at <= now() AND (SELECT ok FROM relay_up)
       AND NOT EXISTS (SELECT 1 FROM domain_throttles t
                        WHERE t.domain = lower(split_part(j.email, '@', 2))
                          AND t.until > now())
     ORDER BY j.priority, j.available_at, j.id
     LIMIT %(n)s
       FOR UPDATE OF j SKIP LOCKED
), campaign AS (
    SELECT d.id, d.priority, d.available_at FROM broadcasts b
     CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.available_at FROM delivery_jobs j
         WHERE j.broadcast_id = b.id AND j.status IN {sql_list(CLAIMABLE)}
           AND j.available_at <= now()
           AND NOT EXISTS (SELECT 1 FROM domain_throttles t
                            WHERE t.domain = lower(split_part(j.email, '@', 2))
                              AND t.until > now())
         ORDER BY j.available_at, j.id
         LIMIT %(n)s
           FOR UPDATE OF j SKIP LOCKED) d
     WHERE b.finished_at IS NULL
       AND EXISTS (SELECT 1 FROM campaigns c WHERE c.id = b.campaign_id
                      AND c.status = '{Campaign.SENDING}')
       AND (SELECT ok FROM relay_up)
), due AS (
    SELECT id FROM (SELECT * FROM transactional UNION ALL SELECT * FROM campaign) c
     ORDER BY priority, available_at, id
     LIMIT %(n)s
), claimed AS (
    UPDATE delivery_jobs j
       SET status = '{SENDING}', claimed_by = %(worker)s, claim_token = CAST(%(token)s AS uuid),
           claimed_at = clock_timestamp(),
           message_id = coalesce(j.message_id, '<' || replace(gen_random_uuid()::text, '-', '')
               || '@' || coalesce((SELECT lower(substring(c.from_addr FROM '@([^@>\s]+)>?\s*$'))
                                     FROM campaigns c WHERE c.id = j.campaign_id), %(domain)s)
               || '>')
      FROM due WHERE j.id = due.id
    RETURNING j.id, j.kind, j.priority, j.email, j.claim_token, j.attempts, j.retry_base,
              j.correlation_id, j.message_id, j.campaign_id, j.subscriber_id, j.broadcast_id,
              j.user_ref, j.payload,
              EXISTS (SELECT 1 FROM suppressions s WHERE s.email = lower(j.email))
                  AS suppressed,
              coalesce((SELECT s.name FROM subscribers s WHERE s.id = j.subscriber_id), '')
                  AS name,
              coalesce((SELECT s.attributes FROM subscribers s WHERE s.id = j.subscriber_id),
                       '{{}}'::jsonb) AS attributes,
              coalesce((SELECT s.tracking FROM subscribers s WHERE s.id = j.subscriber_id),
                       true) AS tracking,
              (SELECT c.updated_at::text FROM campaigns c
                WHERE c.id = coalesce(j.campaign_id, (j.payload ->> 'campaign_id')::bigint))
                  AS campaign_version,
              extract(epoch FROM clock_timestamp() - j.available_at)::float8 AS waited
)
-- One JSON value for the whole batch: decoding it is far cheaper in Python than rows.
SELECT coalesce(json_agg(claimed ORDER BY claimed.id), '[]'::json) AS jobs FROM claimed
"""


def claim_batch(conn: Connection, worker_id: str, n: int, domain: str,
                token: str | None = None, relays: int = 1) -> list[ClaimedJob]:
    """Claim up to ``n`` due jobs for ``worker_id`` under one claim ``token`` (a fresh one
    when None), while one of the first ``relays`` relays is usable. No two workers ever
    get the same job."""
    params = _params(worker_id, n, domain, token, relays)
    return _jobs(conn.exec_driver_sql(_CLAIM, params).scalar_one())


def claim_bounded(session: psycopg.Connection, timeout: float, worker_id: str, n: int,
                  domain: str, token: str, relays: int = 1) -> list[ClaimedJob]:
    """:func:`claim_batch` on an autocommit driver session (the drain threads', one claim
    every ten messages), the statement bounded by ``timeout`` seconds: the setting, the
    claim and the reset go in one round trip (:func:`workers.core.pg.setting_around`), so a
    claim that fails or times out leaves the session's setting as it was."""
    with pg.setting_around(session, "statement_timeout", str(int(timeout * 1000))):
        cursor = session.execute(_CLAIM, _params(worker_id, n, domain, token, relays))
    row = cursor.fetchone()
    return _jobs(row[0] if row else [])


def _params(worker_id: str, n: int, domain: str, token: str | None,
            relays: int) -> dict[str, object]:
    return {"worker": worker_id, "n": n, "domain": domain,
            "token": token or str(uuid.uuid4()), "relays": relays}


def _jobs(rows: list[dict[str, Any]]) -> list[ClaimedJob]:
    jobs = [ClaimedJob(**row) for row in rows]
    jobs.sort(key=lambda j: (j.priority, j.id))
    return jobs


# Claimed jobs a warm-up cap holds back: to `pending` without using an attempt, due at the
# start of the next hour or of the next UTC day (docs/design.md §33).
_HOLD_CLAIMED = sa.text(f"""
UPDATE delivery_jobs
   SET status = '{PENDING}', claimed_by = NULL, claim_token = NULL, claimed_at = NULL,
       available_at = CASE WHEN :next_day
           THEN (date_trunc('day', now() AT TIME ZONE 'UTC') + interval '1 day')
                AT TIME ZONE 'UTC'
           ELSE date_trunc('hour', now()) + interval '1 hour' END
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status = '{SENDING}'
   AND claim_token = ANY(CAST(:tokens AS uuid[]))
""")


def hold_claimed(conn: Connection, jobs: Sequence[ClaimedJob], *, next_day: bool) -> int:
    """Hand claimed jobs back unsent until the next hour (or UTC day, ``next_day``)."""
    if not jobs:
        return 0
    return conn.execute(_HOLD_CLAIMED, {"next_day": next_day,
                                        "ids": [j.id for j in jobs],
                                        "tokens": [j.claim_token for j in jobs]}).rowcount
