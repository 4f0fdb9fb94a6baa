"""Bounces and complaints after acceptance (docs/design.md §18): what an event does to the job, the
suppression list and the campaign, in the caller's transaction.

Every statement says what it guarantees. In short:

- every event is stored on its job (``job_events``: source, type, reason, raw payload),
  once: a provider's event id is unique per source, so a replayed or duplicated event
  changes nothing the second time;
- a hard bounce turns a ``sent`` job into ``bounced`` (the statement-level counter
  triggers move the campaign's counts in the same transaction, P8) and suppresses the
  address with the bounce's text;
- a complaint suppresses the address (reason ``complaint``) and counts once per job toward
  its campaign's complaint rate, which pauses the campaign past the limit;
- a soft bounce only counts: the address is suppressed once it has soft-bounced
  ``soft_limit`` times within ``soft_window`` seconds;
- a ``sender`` bounce (a blocklist, our reputation, our rate: about us) is kept on the job
  and raises the sender alarm; it counts against nobody.

Each event keeps its reason (``reason_code``: Sisimai's vocabulary,
workers/after_acceptance/bounces), and a suppression keeps the reason it was made for.

Outgoing event webhooks for ``bounced`` and ``complained`` are queued by triggers on the
same rows (migration 0015), so they commit or roll back with the change itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers import queue
from workers.after_acceptance import bounce_rules
from workers.after_acceptance.bounces.reasons import find_reason
from workers.after_acceptance.reports import Feedback
from workers.core.states import BOUNCED, SENT, Campaign, sql_list
from workers.delivery import lifecycle

SOURCES = ("mailbox", "ses", "sendgrid", "postmark", "mailgun", "generic")
RAW_LIMIT = 256 * 1024  # bytes of raw source kept per event


@dataclass(frozen=True)
class Thresholds:
    """Per-process settings for the effects (SENDDOCK_SOFT_BOUNCE_*, COMPLAINT_*)."""

    soft_limit: int = 3
    soft_window: float = 30 * 86400
    complaint_alarm: float = 0.001
    complaint_pause: float = 0.003
    complaint_min_sent: int = 100


@dataclass(frozen=True)
class Applied:
    """What one event did: ``effect`` is ``bounced`` (job sent → bounced, suppressed),
    ``suppressed`` (address suppressed, job unchanged), ``soft`` (counted),
    ``sender_alarm`` (about us: recorded, counted against nobody),
    ``soft_suppressed`` (the threshold was reached), ``complaint``, ``duplicate`` (seen
    before: nothing changed) or ``unmatched`` (no job: recorded, nothing else)."""

    event_id: int | None
    job_id: int | None
    effect: str
    campaign_paused: int | None = None


# --- finding the job ---------------------------------------------------------------------

# The job a Message-ID names: Message-IDs are fixed at the first claim and unique per job.
_JOB_BY_MESSAGE_ID = sa.text("""
SELECT id FROM delivery_jobs WHERE message_id = ANY(CAST(:ids AS text[])) ORDER BY id LIMIT 1
""")

_JOB_BY_CORRELATION = sa.text("""
SELECT id FROM delivery_jobs WHERE correlation_id::text = ANY(CAST(:ids AS text[]))
 ORDER BY id LIMIT 1
""")

# For providers that give neither (Postmark without metadata): the newest job sent to the
# address in the window, never an older one.
_LATEST_SENT_TO = sa.text(f"""
SELECT id FROM delivery_jobs
 WHERE lower(email) = lower(:email) AND status IN {sql_list((SENT, BOUNCED))}
   AND finished_at > now() - make_interval(secs => :window)
 ORDER BY finished_at DESC, id DESC LIMIT 1
""")

_JOB_EXISTS = sa.text("SELECT id FROM delivery_jobs WHERE id = ANY(CAST(:ids AS bigint[])) "
                      "ORDER BY id LIMIT 1")


def find_job(conn: Connection, *, verp_job_ids: Sequence[int] = (),
             message_ids: Sequence[str] = (), correlation_ids: Sequence[str] = (),
             email: str | None = None, latest_window: float | None = None) -> int | None:
    """The job an event is about: by VERP token (already verified by the caller), then
    Message-ID, then correlation ID, then (only when ``latest_window`` is given) the newest
    job sent to ``email`` within it. None when nothing matches."""
    if verp_job_ids:
        found = conn.execute(_JOB_EXISTS, {"ids": list(verp_job_ids)}).scalar()
        if found:
            return int(found)
    if message_ids:
        found = conn.execute(_JOB_BY_MESSAGE_ID, {"ids": list(message_ids)}).scalar()
        if found:
            return int(found)
    if correlation_ids:
        found = conn.execute(_JOB_BY_CORRELATION, {"ids": list(correlation_ids)}).scalar()
        if found:
            return int(found)
    if latest_window is not None and email:
        found = conn.execute(_LATEST_SENT_TO, {"email": email, "window": latest_window}
                             ).scalar()
        if found:
            return int(found)
    return None


# --- recording and applying --------------------------------------------------------------

# Stored once: (source, event_id) is unique, so the same provider event twice is a no-op.
_RECORD = sa.text("""
INSERT INTO job_events (job_id, source, type, bounce, email, reason, status, event_id,
                        message_id, raw, effect, reason_code, rule_id, read_as)
VALUES (:job_id, :source, :type, :bounce, :email, :reason, :status, :event_id, :message_id,
        :raw, 'recorded', :code, :rule_id, :read_as)
ON CONFLICT (source, event_id) WHERE event_id IS NOT NULL DO NOTHING
RETURNING id
""")

_SET_EFFECT = sa.text("UPDATE job_events SET effect = :effect WHERE id = :id")

_JOB = sa.text("""
SELECT id, email, status, broadcast_id, campaign_id FROM delivery_jobs WHERE id = :id
   FOR UPDATE
""")

_SUPPRESS = sa.text("""
INSERT INTO suppressions (email, reason, job_id, reply, created_by, reason_code)
VALUES (lower(:email), :reason, :job_id, :reply, :by, :code)
ON CONFLICT (email) DO NOTHING
RETURNING email
""")

# Soft bounces for one address within the window (job_events_email_idx).
_SOFT_COUNT = sa.text("""
SELECT count(*) FROM job_events
 WHERE lower(email) = lower(:email) AND type = 'bounce' AND bounce = 'soft'
   AND created_at > now() - make_interval(secs => :window)
""")

# A job counts once toward its campaign's complaint rate, however many complaints name it.
_FIRST_COMPLAINT = sa.text("""
SELECT count(*) = 1 FROM job_events WHERE job_id = :job_id AND type = 'complaint'
""")

_COUNT_COMPLAINT = sa.text("""
UPDATE broadcasts SET complaints = complaints + 1 WHERE id = :id RETURNING complaints
""")


def record_event(conn: Connection, source: str, feedback: Feedback, job_id: int | None,
                 raw: str | bytes | dict[str, Any] | list[Any], *,
                 rule: bounce_rules.Rule | None = None, read_as: str | None = None
                 ) -> int | None:
    """Store the event (None: this source's event id was stored before); ``rule`` decided
    its reason, which the reader had read as ``read_as``."""
    if isinstance(raw, bytes):
        text = raw[:RAW_LIMIT].decode("utf-8", "replace")
    elif isinstance(raw, str):
        text = raw[:RAW_LIMIT]
    else:
        text = json.dumps(raw)[:RAW_LIMIT]
    row = conn.execute(_RECORD, {
        "job_id": job_id, "source": source, "type": feedback.type, "bounce": feedback.bounce,
        "email": feedback.email.replace("\x00", ""),
        "reason": feedback.reason[:1000].replace("\x00", ""),
        "status": feedback.status.replace("\x00", "") if feedback.status else None,
        "event_id": feedback.event_id, "message_id": feedback.message_id,
        "raw": text.replace("\x00", ""), "code": feedback.code,
        "rule_id": rule.id if rule else None, "read_as": read_as}).first()
    return None if row is None else int(row.id)


def apply_event(conn: Connection, source: str, feedback: Feedback, job_id: int | None,
                raw: str | bytes | dict[str, Any] | list[Any],
                thresholds: Thresholds) -> Applied:
    """Record one event and apply its effect (see the module docstring). The address acted
    on is the job's own when a job matched (the one SendDock sends to), else the event's.
    Without a job only the generic webhook's direct address events suppress; mailbox and
    provider callers pass ``job_id=None`` only for what they record as unmatched."""
    job = conn.execute(_JOB, {"id": job_id}).mappings().first() if job_id else None
    if job is not None and not feedback.email:
        feedback = replace(feedback, email=str(job["email"]).lower())
    if feedback.code is None:  # a provider's event: its reason, read from its text
        feedback = replace(feedback, code="feedback" if feedback.type == "complaint"
                           else find_reason(feedback.reason, feedback.status))
    read_as, rule = feedback.code, bounce_rules.find(conn, feedback.reason)
    if rule is not None:  # an admin's correction decides (docs/design.md §36)
        feedback = bounce_rules.decided(feedback, rule.reason)
    event_id = record_event(conn, source, feedback, job_id, raw, rule=rule,
                            read_as=read_as if rule is not None else None)
    if event_id is None:
        return Applied(None, job_id, "duplicate")
    if rule is not None:
        bounce_rules.count_hit(conn, rule)
    email = str(job["email"]) if job is not None else feedback.email
    by = f"system:{source}"
    effect, paused = "recorded", None
    if feedback.type == "bounce" and feedback.bounce is None:
        effect = "ignored"  # a rule says it is an auto-reply or a delivery notice
    elif feedback.type == "bounce" and feedback.bounce == "hard":
        moved = job is not None and job_id is not None \
            and queue.bounce_sent(conn, job_id, feedback.reason[:1000])
        conn.execute(_SUPPRESS, {"email": email, "reason": "bounced", "job_id": job_id,
                                 "reply": feedback.reason[:1000], "by": by,
                                 "code": feedback.code})
        effect = "bounced" if moved else "suppressed"
    elif feedback.type == "bounce" and feedback.bounce == "sender":
        # About us (a blocklist, our reputation, our rate): the recipient did nothing. Kept
        # on the job and raised as a sender alarm (webapp/health.py), counted against nobody.
        effect = "sender_alarm"
    elif feedback.type == "bounce":
        effect = "soft"
        n = int(conn.execute(_SOFT_COUNT, {"email": email,
                                           "window": thresholds.soft_window}).scalar() or 0)
        if n >= thresholds.soft_limit:
            days = max(1, round(thresholds.soft_window / 86400))
            reply = f"{n} soft bounces in {days} days; last: {feedback.reason}"[:1000]
            if conn.execute(_SUPPRESS, {"email": email, "reason": "bounced",
                                        "job_id": job_id, "reply": reply, "by": by,
                                        "code": feedback.code}).first():
                effect = "soft_suppressed"
    else:
        effect = "complaint"
        conn.execute(_SUPPRESS, {"email": email, "reason": "complaint", "job_id": job_id,
                                 "reply": feedback.reason[:1000], "by": by,
                                 "code": feedback.code or "feedback"})
        if job is not None and job["broadcast_id"] is not None and \
                conn.execute(_FIRST_COMPLAINT, {"job_id": job_id}).scalar():
            conn.execute(_COUNT_COMPLAINT, {"id": job["broadcast_id"]})
            paused = check_complaint_rate(conn, int(job["broadcast_id"]), thresholds)
    conn.execute(_SET_EFFECT, {"effect": effect, "id": event_id})
    return Applied(event_id, job_id, effect, paused)


def record_unmatched(conn: Connection, source: str, feedback: Feedback,
                     raw: str | bytes | dict[str, Any] | list[Any]) -> Applied:
    """Keep an event no job matched, with no effect (a forged or foreign report must not
    suppress anyone)."""
    event_id = record_event(conn, source, feedback, None, raw)
    if event_id is None:
        return Applied(None, None, "duplicate")
    conn.execute(_SET_EFFECT, {"effect": "unmatched", "id": event_id})
    return Applied(event_id, None, "unmatched")


# --- complaint-rate protection -----------------------------------------------------------

# Delivered = sent + bounced (a late bounce was delivered to the relay first); the counters
# come from broadcast_counts, the same exact numbers the campaign page shows (P8).
_RATE = sa.text(f"""
SELECT b.complaints, c.id AS campaign_id, c.status,
       coalesce((SELECT sum(n) FROM broadcast_counts bc
                  WHERE bc.broadcast_id = b.id AND bc.status IN {sql_list((SENT, BOUNCED))}), 0)
           AS delivered
  FROM broadcasts b JOIN campaigns c ON c.id = b.campaign_id
 WHERE b.id = :id
""")


def complaint_rate(complaints: int, delivered: int) -> float:
    return complaints / delivered if delivered else 0.0


def check_complaint_rate(conn: Connection, broadcast_id: int,
                         thresholds: Thresholds) -> int | None:
    """Pause the broadcast's campaign when its complaint rate reached
    ``complaint_pause`` over at least ``complaint_min_sent`` delivered messages. Returns
    the paused campaign's id (None when nothing was paused)."""
    row = conn.execute(_RATE, {"id": broadcast_id}).mappings().first()
    if row is None or row["status"] != Campaign.SENDING:
        return None
    delivered = int(row["delivered"])
    rate = complaint_rate(int(row["complaints"]), delivered)
    if delivered < thresholds.complaint_min_sent or rate < thresholds.complaint_pause:
        return None
    reason = (f"the complaint rate {rate:.2%} ({row['complaints']} of {delivered} "
              f"delivered) reached the {thresholds.complaint_pause:.2%} limit")
    campaign_id = int(row["campaign_id"])
    if not lifecycle.pause_campaign(conn, campaign_id, reason, "system"):
        return None
    return campaign_id


# Campaigns whose complaint rate is at or above the alarm level (sending or paused ones).
_ALARMING = sa.text(f"""
SELECT c.id, c.name, c.status, b.complaints, d.delivered
  FROM campaigns c JOIN broadcasts b ON b.id = c.broadcast_id
  CROSS JOIN LATERAL (
    SELECT coalesce(sum(n), 0) AS delivered FROM broadcast_counts bc
     WHERE bc.broadcast_id = b.id AND bc.status IN {sql_list((SENT, BOUNCED))}) d
 WHERE b.complaints > 0 AND b.finished_at IS NULL
""")


def complaint_rates(conn: Connection) -> list[dict[str, Any]]:
    """Open campaigns with complaints: id, name, status, complaints, delivered, rate."""
    rows = []
    for row in conn.execute(_ALARMING).mappings():
        item = dict(row)
        item["rate"] = complaint_rate(int(row["complaints"]), int(row["delivered"]))
        rows.append(item)
    return rows


# --- reading ------------------------------------------------------------------------------

_EVENTS_FOR_JOBS = sa.text("""
SELECT id, job_id, source, type, bounce, email, reason, status, event_id, effect, created_at,
       reason_code,
       left(raw, 20000) AS raw, length(raw) > 20000 AS raw_truncated
  FROM job_events WHERE job_id = ANY(CAST(:ids AS bigint[])) ORDER BY job_id, created_at, id
""")


def events_for_jobs(conn: Connection, job_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
    """The bounce/complaint events of several jobs (oldest first), keyed by job id."""
    result: dict[int, list[dict[str, Any]]] = {i: [] for i in job_ids}
    if job_ids:
        for row in conn.execute(_EVENTS_FOR_JOBS, {"ids": list(job_ids)}).mappings():
            result[row["job_id"]].append(dict(row))
    return result


# --- sender bounces and unreadable mail (docs/design.md §17) --------------------------------------

_SENDER_BOUNCES = sa.text("""
SELECT coalesce(reason_code, 'blocked') AS reason, count(*) AS n, max(created_at) AS last_at,
       (array_agg(reason ORDER BY created_at DESC, id DESC))[1] AS last_reason
  FROM job_events
 WHERE type = 'bounce' AND bounce = 'sender'
   AND created_at > now() - make_interval(secs => :window)
 GROUP BY 1 ORDER BY 2 DESC, 1
""")


def sender_bounces(conn: Connection, window: float = 86400) -> list[dict[str, Any]]:
    """Bounces about our sending (blocklist, reputation, rate…) in the last ``window``
    seconds, by reason: reason, n, last_at, last_reason (the newest text)."""
    return [dict(r) for r in conn.execute(_SENDER_BOUNCES, {"window": window}).mappings()]


_RECORD_UNREADABLE = sa.text("""
INSERT INTO mailbox_unreadable (digest, subject, sender, error, folder, raw)
VALUES (:digest, :subject, :sender, :error, :folder, :raw)
ON CONFLICT (digest) DO NOTHING
""")


def record_unreadable(conn: Connection, digest: str, *, subject: str, sender: str,
                      error: str, folder: str, raw: bytes = b"") -> None:
    """List a bounce-mailbox message the reader could not understand (once per digest),
    with its source (a POP3 mailbox cannot keep it in a folder)."""
    conn.execute(_RECORD_UNREADABLE, {
        "raw": raw[:RAW_LIMIT].decode("utf-8", "replace").replace("\x00", ""),
        "digest": digest, "subject": subject.replace("\x00", "")[:300],
        "sender": sender.replace("\x00", "")[:300], "error": error.replace("\x00", "")[:1000],
        "folder": folder[:200]})


def unreadable_mail(conn: Connection, limit: int = 20,
                    window: float | None = None) -> list[dict[str, Any]]:
    """The newest messages the bounce reader could not understand (optionally only those
    of the last ``window`` seconds)."""
    return [dict(r) for r in conn.execute(sa.text("""
        SELECT id, subject, sender, error, folder, created_at FROM mailbox_unreadable
         WHERE (CAST(:window AS float8) IS NULL
                OR created_at > now() - make_interval(secs => CAST(:window AS float8)))
         ORDER BY created_at DESC, id DESC LIMIT :limit"""),
        {"limit": limit, "window": window}).mappings()]
