"""Webhook intake (docs/design.md §18): an authenticated provider request becomes effects on jobs,
in one transaction, or a clear refusal with nothing changed.

- A replay of a signed request (same SNS MessageId, SendGrid timestamp and body, Postmark
  record id) is refused with 409: its receipt is stored with the effects. A Mailgun
  request's receipt (timestamp and token: what Mailgun signs) is stored by :func:`consume`
  before anything else, refused or not.
- An event for a message SendDock did not send (no VERP token, Message-ID or correlation
  ID of ours) refuses the whole request with 404 — except the generic webhook's events
  without a ``message_id``, which are about the address alone. In a SendGrid batch only
  known messages are applied and the rest recorded as unmatched, since one foreign event
  must not make SendGrid retry (and lose) the whole batch.
- Duplicated events inside new requests (the same provider event id) are skipped.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.errors import Conflict, NotFound
from webapp.inbound_webhooks.base import Inbound, Provider, ProviderEvent
from workers.after_acceptance import feedback
from workers.building.links import job_from_bounce_address

# A provider that gives no reference to our message (Postmark): the newest job sent to the
# address within this window is the one (documented in docs/deliverability.md).
LATEST_WINDOW = 7 * 86400


def _job_for(conn: Connection, event: ProviderEvent, *, secret_key: str,
             bounce_address: str | None, provider: Provider) -> int | None:
    verp = [j for j in (job_from_bounce_address(secret_key, a, bounce_address)
                        for a in event.refs.addresses) if j is not None]
    refs = event.refs
    no_refs = not (verp or refs.message_ids or refs.correlation_ids)
    return feedback.find_job(
        conn, verp_job_ids=verp, message_ids=refs.message_ids,
        correlation_ids=refs.correlation_ids, email=event.feedback.email,
        latest_window=LATEST_WINDOW if provider.match_newest_to_address and no_refs
        else None)


def consume(conn: Connection, source: str, key: str) -> None:
    """Record a signed request's replay key now, in the caller's own transaction, whatever
    happens to the request afterwards; raises Conflict when it was seen before."""
    fresh = conn.execute(sa.text("""
        INSERT INTO feedback_receipts (source, key) VALUES (:source, :key)
        ON CONFLICT DO NOTHING RETURNING key"""), {"source": source, "key": key}).first()
    if fresh is None:
        raise Conflict("this webhook request was already processed (a replay)")


def receive(conn: Connection, inbound: Inbound, provider: Provider, *, secret_key: str,
            bounce_address: str | None, thresholds: feedback.Thresholds) -> dict[str, Any]:
    """Apply an authenticated request. Raises Conflict (replay) or NotFound (an event for
    a message that is not ours); the caller's transaction then rolls back."""
    if inbound.replay_key is not None:
        consume(conn, inbound.source, inbound.replay_key)
    summary: dict[str, Any] = {"received": len(inbound.events), "applied": 0,
                               "duplicates": 0, "unmatched": 0, "ignored": inbound.ignored,
                               "effects": {}}
    for event in inbound.events:
        job_id = _job_for(conn, event, secret_key=secret_key, bounce_address=bounce_address,
                          provider=provider)
        direct = provider.address_events and not event.refs.message_ids
        if job_id is None and not direct:
            if not provider.batch:
                raise NotFound("no message sent by SendDock matches this event",
                               fields={"message": "unknown message"})
            outcome = feedback.record_unmatched(conn, inbound.source, event.feedback,
                                                event.raw)
        else:
            outcome = feedback.apply_event(conn, inbound.source, event.feedback, job_id,
                                           event.raw, thresholds)
        key = {"duplicate": "duplicates", "unmatched": "unmatched"}.get(outcome.effect,
                                                                      "applied")
        summary[key] += 1
        summary["effects"][outcome.effect] = summary["effects"].get(outcome.effect, 0) + 1
        if outcome.campaign_paused is not None:
            summary.setdefault("paused_campaigns", []).append(outcome.campaign_paused)
    return summary


# --- webhook tokens for /webhooks/generic ------------------------------------------------

def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_webhook_token(conn: Connection, name: str = "", *, actor: str = "cli") -> str:
    """A new bearer token for the generic webhook; only its hash is stored."""
    token = "sdwh_" + secrets.token_urlsafe(32)
    conn.execute(sa.text("""
        INSERT INTO webhook_tokens (name, prefix, token_hash) VALUES (:name, :prefix, :hash)
    """), {"name": name, "prefix": token[:10], "hash": _hash(token)})
    audit.record(conn, actor, "webhook_token.create", f"webhook_token:{token[:10]}",
                 name=name)
    return token


def check_webhook_token(conn: Connection, header: str | None) -> bool:
    """Whether ``Authorization: Bearer <token>`` names a live webhook token."""
    if not header or not header.lower().startswith("bearer "):
        return False
    token = header.split(None, 1)[1].strip()
    row = conn.execute(sa.text("""
        UPDATE webhook_tokens SET last_used_at = now()
         WHERE token_hash = :hash AND revoked_at IS NULL RETURNING id"""),
                       {"hash": _hash(token)}).first()
    return row is not None


def revoke_webhook_token(conn: Connection, prefix: str, *, actor: str = "cli") -> int:
    n = conn.execute(sa.text("UPDATE webhook_tokens SET revoked_at = now() "
                             "WHERE prefix = :p AND revoked_at IS NULL"), {"p": prefix}).rowcount
    if n:
        audit.record(conn, actor, "webhook_token.revoke", f"webhook_token:{prefix}")
    return n
