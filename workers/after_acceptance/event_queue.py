"""The queue of outgoing event webhooks (docs/design.md §18): every statement, with what it
guarantees.

A delivery is one event (``sent``, ``bounced``, ``complained``, ``failed``,
``unsubscribed``) for one endpoint. Triggers (migration 0015) insert it in the same
transaction as the change it reports, so an event exists exactly when its change
committed. Its states: ``pending → sending → delivered | retry → sending … | failed``.

- Claimed with ``FOR UPDATE SKIP LOCKED``: no two deliverers hold the same row.
- A claim is a lease: a row left ``sending`` by a process that died is claimable again
  once ``lease`` seconds old (the POST timeout is far shorter), so nothing is stuck. The
  receiver may then see a delivery twice with the same ``webhook-id`` (Standard
  Webhooks' idempotency key): at least once, never lost.
- Finished under the claim token, so a row taken back is never finished twice.
- Endpoints that are disabled (by an admin, or automatically once they have failed
  continuously -- no 2xx -- for ``disable_after`` seconds) are not claimed from; their
  rows wait. A count of failures is no measure: one campaign's bounces are dozens of
  events within a minute, all failing against an endpoint that is down for a deploy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import sql_list

PENDING, SENDING, RETRY, DELIVERED, FAILED = "pending", "sending", "retry", "delivered", "failed"
DELIVERY_STATUSES = (PENDING, SENDING, RETRY, DELIVERED, FAILED)
WAITING = (PENDING, RETRY)
EVENTS = ("sent", "bounced", "complained", "failed", "unsubscribed")


@dataclass
class ClaimedDelivery:
    id: int
    claim_token: str
    endpoint_id: int
    url: str
    secret: str
    event: str
    msg_id: str
    payload: dict[str, Any]
    attempts: int


# Due deliveries of enabled endpoints, oldest first, plus leases that ran out.
_CLAIM = sa.text(f"""
WITH due AS (
    SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
     WHERE e.enabled AND e.disabled_at IS NULL
       AND d.endpoint_id <> ALL(CAST(:busy AS bigint[]))
       AND ((d.status IN {sql_list(WAITING)} AND d.available_at <= now())
            OR (d.status = '{SENDING}'
                AND d.claimed_at < now() - make_interval(secs => :lease)))
     ORDER BY d.available_at, d.id
     LIMIT :n
       FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d
   SET status = '{SENDING}', claimed_by = :worker, claim_token = gen_random_uuid(),
       claimed_at = now()
  FROM due, webhook_endpoints e
 WHERE d.id = due.id AND e.id = d.endpoint_id
RETURNING d.id, d.claim_token::text AS claim_token, d.endpoint_id, e.url, e.secret, d.event,
          d.msg_id, d.payload, d.attempts
""")


def claim_deliveries(conn: Connection, worker_id: str, n: int, lease: float = 120,
                     busy: Sequence[int] = ()) -> list[ClaimedDelivery]:
    """Claim up to ``n`` due deliveries, none of the endpoints in ``busy`` (their lanes
    are running). No two callers ever get the same row."""
    rows = conn.execute(_CLAIM, {"worker": worker_id, "n": n, "lease": lease,
                                 "busy": list(busy)}).mappings()
    return sorted((ClaimedDelivery(**dict(r)) for r in rows), key=lambda d: d.id)


# One outcome: delivered, or retried after `delay` seconds, or failed for good (delay
# NULL); the endpoint's health and last response move in the same statement. An endpoint
# that has failed without a success for `disable_after` seconds (since `failing_since`) is
# disabled with the reason (the alarm); 0 never disables.
_FINISH = sa.text(f"""
WITH d AS (
    UPDATE webhook_deliveries
       SET status = CASE WHEN :ok THEN '{DELIVERED}'
                         WHEN CAST(:delay AS float8) IS NULL THEN '{FAILED}'
                         ELSE '{RETRY}' END,
           attempts = attempts + 1,
           available_at = CASE WHEN CAST(:delay AS float8) IS NULL THEN available_at
                               ELSE now() + make_interval(secs => CAST(:delay AS float8)) END,
           finished_at = CASE WHEN :ok OR CAST(:delay AS float8) IS NULL THEN now() END,
           last_status = :code, last_response = :response, last_error = :error,
           claimed_by = NULL, claim_token = NULL, claimed_at = NULL
     WHERE id = :id AND status = '{SENDING}' AND claim_token = CAST(:token AS uuid)
    RETURNING endpoint_id
)
UPDATE webhook_endpoints e
   SET last_attempt_at = now(), last_status = :code,
       last_response = coalesce(:response, :error),
       last_success_at = CASE WHEN :ok THEN now() ELSE last_success_at END,
       consecutive_failures = CASE WHEN :ok THEN 0 ELSE consecutive_failures + 1 END,
       failing_since = CASE WHEN :ok THEN NULL ELSE coalesce(failing_since, now()) END,
       disabled_at = CASE WHEN NOT :ok AND :disable_after > 0 AND disabled_at IS NULL
                           AND failing_since <= now() - make_interval(secs => :disable_after)
                          THEN now() ELSE disabled_at END,
       disabled_reason = CASE WHEN NOT :ok AND :disable_after > 0 AND disabled_at IS NULL
                               AND failing_since <= now() - make_interval(secs => :disable_after)
                              THEN left(coalesce(:error, :response, ''), 300)
                              ELSE disabled_reason END
  FROM d WHERE e.id = d.endpoint_id
RETURNING e.id, e.disabled_at = now() AND NOT :ok AS just_disabled
""")


def finish_delivery(conn: Connection, delivery: ClaimedDelivery, *, ok: bool,
                    code: int | None, response: str | None, error: str | None,
                    delay: float | None, disable_after: float) -> bool | None:
    """Record one attempt's outcome. Returns whether the endpoint was disabled by it
    (None when the claim was no longer ours: nothing recorded)."""
    row = conn.execute(_FINISH, {
        "id": delivery.id, "token": delivery.claim_token, "ok": ok, "code": code,
        "response": response[:2000] if response is not None else None,
        "error": error[:2000] if error is not None else None, "delay": delay,
        "disable_after": disable_after}).first()
    return None if row is None else bool(row.just_disabled)


# Hand back claimed rows without using an attempt (their endpoint just failed in this
# batch: no point hammering it), due again after `delay` seconds.
_RELEASE = sa.text(f"""
UPDATE webhook_deliveries
   SET status = '{RETRY}', available_at = now() + make_interval(secs => :delay),
       claimed_by = NULL, claim_token = NULL, claimed_at = NULL
 WHERE id = ANY(CAST(:ids AS bigint[])) AND status = '{SENDING}'
   AND claim_token = ANY(CAST(:tokens AS uuid[]))
""")


def release_deliveries(conn: Connection, claimed: Sequence[ClaimedDelivery],
                       delay: float) -> int:
    if not claimed:
        return 0
    return conn.execute(_RELEASE, {"ids": [d.id for d in claimed],
                                   "tokens": [d.claim_token for d in claimed],
                                   "delay": delay}).rowcount


# --- endpoints (admin pages) -------------------------------------------------------------

_ENDPOINT_COLUMNS = """
e.id, e.url, e.description, e.events, e.kinds, e.enabled, e.disabled_at, e.disabled_reason,
e.consecutive_failures, e.failing_since, e.last_attempt_at, e.last_success_at, e.last_status,
e.last_response, e.created_at
"""


def create_endpoint(conn: Connection, *, url: str, events: Sequence[str], secret: str,
                    description: str = "", kinds: Sequence[str] = ()) -> int:
    return int(conn.execute(sa.text("""
        INSERT INTO webhook_endpoints (url, description, events, kinds, secret)
        VALUES (:url, :description, CAST(:events AS text[]), CAST(:kinds AS text[]), :secret)
        RETURNING id"""), {"url": url, "description": description, "events": list(events),
                           "kinds": list(kinds), "secret": secret}).scalar_one())


def endpoints(conn: Connection) -> list[dict[str, Any]]:
    """Every endpoint with its backlog (waiting deliveries) and failed count."""
    rows = conn.execute(sa.text(f"""
        SELECT {_ENDPOINT_COLUMNS},
               (SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id
                  AND d.status IN {sql_list((*WAITING, SENDING))}) AS waiting,
               (SELECT count(*) FROM webhook_deliveries d WHERE d.endpoint_id = e.id
                  AND d.status = '{FAILED}') AS failed
          FROM webhook_endpoints e ORDER BY e.id"""))
    return [dict(r) for r in rows.mappings()]


def get_endpoint(conn: Connection, endpoint_id: int) -> dict[str, Any] | None:
    row = conn.execute(sa.text(f"SELECT {_ENDPOINT_COLUMNS}, e.secret FROM webhook_endpoints e"
                               " WHERE e.id = :id"), {"id": endpoint_id}).mappings().first()
    return dict(row) if row else None


def set_endpoint_enabled(conn: Connection, endpoint_id: int, enabled: bool) -> bool:
    """Enable (clearing an automatic disable and the failure streak; waiting deliveries
    are due at once) or disable an endpoint."""
    row = conn.execute(sa.text("""
        UPDATE webhook_endpoints
           SET enabled = :enabled,
               disabled_at = CASE WHEN :enabled THEN NULL ELSE disabled_at END,
               disabled_reason = CASE WHEN :enabled THEN NULL ELSE disabled_reason END,
               consecutive_failures = CASE WHEN :enabled THEN 0 ELSE consecutive_failures END,
               failing_since = CASE WHEN :enabled THEN NULL ELSE failing_since END
         WHERE id = :id RETURNING id"""), {"id": endpoint_id, "enabled": enabled}).first()
    if row is not None and enabled:
        conn.execute(sa.text(f"""
            UPDATE webhook_deliveries SET available_at = now()
             WHERE endpoint_id = :id AND status IN {sql_list(WAITING)}"""),
                     {"id": endpoint_id})
    return row is not None


def delete_endpoint(conn: Connection, endpoint_id: int) -> bool:
    return conn.execute(sa.text("DELETE FROM webhook_endpoints WHERE id = :id RETURNING id"),
                        {"id": endpoint_id}).first() is not None


def retry_failed(conn: Connection, endpoint_id: int) -> int:
    """Put an endpoint's failed deliveries back in the queue (due now, attempts reset)."""
    return conn.execute(sa.text(f"""
        UPDATE webhook_deliveries
           SET status = '{PENDING}', attempts = 0, available_at = now(), finished_at = NULL
         WHERE endpoint_id = :id AND status = '{FAILED}'"""), {"id": endpoint_id}).rowcount


def deliveries(conn: Connection, endpoint_id: int, limit: int = 50) -> list[dict[str, Any]]:
    """The endpoint's delivery log, newest first."""
    rows = conn.execute(sa.text("""
        SELECT id, event, msg_id, status, attempts, available_at, last_status, last_response,
               last_error, created_at, finished_at, payload
          FROM webhook_deliveries WHERE endpoint_id = :id
         ORDER BY created_at DESC, id DESC LIMIT :limit"""), {"id": endpoint_id,
                                                               "limit": limit})
    return [dict(r) for r in rows.mappings()]


def disabled_endpoints(conn: Connection) -> list[dict[str, Any]]:
    """Endpoints disabled automatically (the alarm)."""
    rows = conn.execute(sa.text("""
        SELECT id, url, disabled_at, disabled_reason, failing_since, consecutive_failures
          FROM webhook_endpoints
         WHERE enabled AND disabled_at IS NOT NULL ORDER BY id"""))
    return [dict(r) for r in rows.mappings()]


def failing_endpoints(conn: Connection, longer_than: float) -> list[dict[str, Any]]:
    """Enabled endpoints that have answered no 2xx for more than ``longer_than`` seconds
    and are not disabled yet (the early warning)."""
    rows = conn.execute(sa.text("""
        SELECT id, url, failing_since, consecutive_failures FROM webhook_endpoints
         WHERE enabled AND disabled_at IS NULL
           AND failing_since < now() - make_interval(secs => :longer)
         ORDER BY id"""), {"longer": longer_than})
    return [dict(r) for r in rows.mappings()]


def display_url(url: str) -> str:
    """The endpoint's address as a banner may show it: scheme, host, port and path --
    never its credentials, query string or fragment (a token often lives there)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def delivery_counts(conn: Connection) -> dict[str, int]:
    """Deliveries per state (for /metrics)."""
    counts = dict.fromkeys(DELIVERY_STATUSES, 0)
    for row in conn.execute(sa.text("SELECT status, count(*) AS n FROM webhook_deliveries "
                                    "GROUP BY status")):
        counts[row.status] = int(row.n)
    return counts


def payload_json(delivery: ClaimedDelivery) -> str:
    """The exact body sent (and signed): compact JSON of the stored payload."""
    return json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True)
