"""A person's data on request (GDPR articles 15 and 17): everything SendDock holds about
one email address, as JSON; and its erasure.

Erasing deletes the subscriber (attributes, memberships, opens and clicks go with it) and
the subscription requests (consent records); jobs keep their row, status and counts but
lose the address (replaced by ``erased-<hash>@erased.invalid``), their payload, user
reference and any reply or feedback text naming it. The suppression (when there was
none: ``manual``) is kept only as the SHA-256 of the address in ``erased_addresses``: if
the address is added again (a subscriber, a job), a trigger puts it back on the
suppression list, so the person is not mailed again. Both are audited, under the hash.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.lists import check_email
from workers import queue


def address_hash(email: str) -> str:
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()


def _rows(conn: Connection, sql: str, **params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sa.text(sql), params).mappings()]


def export(conn: Connection, email: str, *, actor: str) -> dict[str, Any]:
    """Everything held about ``email`` (audited)."""
    address = check_email(email).lower()
    subscriber = _rows(conn, "SELECT id, email, name, attributes, status, tracking, created_at "
                             "FROM subscribers WHERE lower(email) = :e", e=address)
    sub_id = subscriber[0]["id"] if subscriber else None
    jobs = _rows(conn, """
        SELECT id, kind, status, created_at, finished_at, attempts, message_id, user_ref,
               campaign_id, payload, last_error
          FROM delivery_jobs WHERE lower(email) = :e ORDER BY id""", e=address)
    job_ids = [j["id"] for j in jobs]
    attempts = _rows(conn, """
        SELECT job_id, attempt, started_at, outcome, smtp_code, enhanced_code, reply
          FROM job_attempts WHERE job_id = ANY(:ids) ORDER BY job_id, attempt""",
                     ids=job_ids)
    for job in jobs:
        job["attempt_log"] = [a for a in attempts if a["job_id"] == job["id"]]
    data = {
        "email": address,
        "subscriber": subscriber[0] if subscriber else None,
        "memberships": _rows(conn, """
            SELECT m.list_id, l.name AS list_name, m.created_at
              FROM memberships m JOIN lists l ON l.id = m.list_id
             WHERE m.subscriber_id = :s ORDER BY m.list_id""", s=sub_id),
        "consent_records": _rows(conn, """
            SELECT list_id, source, locale, remote_addr, requested_at, confirmed_at,
                   confirmed_addr
              FROM subscription_requests WHERE lower(email) = :e ORDER BY id""", e=address),
        "jobs": jobs,
        "tracking_events": _rows(conn, """
            SELECT e.campaign_id, e.job_id, e.kind, l.url, e.at
              FROM campaign_events e LEFT JOIN campaign_links l ON l.id = e.link_id
             WHERE e.subscriber_id = :s ORDER BY e.at""", s=sub_id),
        "sequence_tracking_events": _rows(conn, """
            SELECT st.sequence_id, e.step_id, e.job_id, e.kind, l.url, e.at
              FROM sequence_events e JOIN sequence_steps st ON st.id = e.step_id
              LEFT JOIN sequence_links l ON l.id = e.link_id
             WHERE e.subscriber_id = :s ORDER BY e.at""", s=sub_id),
        "feedback_events": _rows(conn, """
            SELECT job_id, source, type, bounce, reason, created_at
              FROM job_events WHERE lower(email) = :e ORDER BY id""", e=address),
        "suppressions": _rows(conn, """
            SELECT email, reason, reason_code, note, created_at FROM suppressions
             WHERE email = :e""", e=address),
        "erased_before": _rows(conn, "SELECT reason, erased_at FROM erased_addresses "
                                     "WHERE email_hash = :h", h=address_hash(address)),
    }
    audit.record(conn, actor, "personal_data.export", f"address:{address_hash(address)}")
    return data


def erase(conn: Connection, email: str, *, actor: str) -> dict[str, int]:
    """Erase ``email`` (see the module's doc); returns what was touched, counted."""
    address = check_email(email).lower()
    digest = address_hash(address)
    placeholder = f"erased-{digest[:16]}@erased.invalid"
    pattern = re.escape(address)
    counts: dict[str, int] = {}
    suppressed = conn.execute(sa.text("DELETE FROM suppressions WHERE email = :e "
                                      "RETURNING reason"), {"e": address}).scalar()
    conn.execute(sa.text("""
        INSERT INTO erased_addresses (email_hash, reason) VALUES (:h, :r)
        ON CONFLICT (email_hash) DO UPDATE SET erased_at = now()"""),
        {"h": digest, "r": suppressed or "manual"})
    counts["subscribers"] = conn.execute(sa.text(
        "DELETE FROM subscribers WHERE lower(email) = :e"), {"e": address}).rowcount
    counts["consent_records"] = conn.execute(sa.text(
        "DELETE FROM subscription_requests WHERE lower(email) = :e"), {"e": address}).rowcount
    job_ids = queue.erase_address(conn, address, placeholder, pattern)
    counts["jobs"] = len(job_ids)
    conn.execute(sa.text("""
        UPDATE job_attempts SET reply = regexp_replace(reply, :rx, '[erased]', 'gi')
         WHERE job_id = ANY(:ids) AND reply IS NOT NULL"""), {"ids": job_ids, "rx": pattern})
    counts["feedback_events"] = conn.execute(sa.text("""
        UPDATE job_events SET email = :p, raw = '',
               reason = regexp_replace(reason, :rx, '[erased]', 'gi')
         WHERE lower(email) = :e"""), {"p": placeholder, "e": address, "rx": pattern}).rowcount
    audit.record(conn, actor, "personal_data.erase", f"address:{digest}",
                 suppressed=suppressed or "manual", **counts)
    return counts
