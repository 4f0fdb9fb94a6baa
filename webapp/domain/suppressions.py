"""The suppression list: addresses SendDock never sends to (docs/design.md §22).

One row per lower-cased address with its reason (``bounced``, ``unsubscribed``,
``complaint``, ``manual``), the job and SMTP reply that caused it, a note and who added it.
Every change writes the audit log in the same transaction. The claim reads this table, so
an address added here is skipped from the next claim on, and a cleared one is sent to by
the next campaign.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit, text_limits
from webapp.domain.errors import Invalid
from webapp.domain.lists import check_email
from webapp.models import SUPPRESSION_REASONS
from workers.core.i18n import N_

PAGE_SIZE = 50
MAX_PASTE = 10_000


def check_reason(reason: str) -> str:
    if reason not in SUPPRESSION_REASONS:
        raise Invalid(N_("reason must be one of %(choices)s",
                         choices=", ".join(SUPPRESSION_REASONS)),
                      fields={"reason": N_("unknown reason")})
    return reason


def suppress(conn: Connection, email: str, reason: str, *, job_id: int | None = None,
             reply: str | None = None, note: str = "", actor: str) -> bool:
    """Put ``email`` on the list (lower-cased). Returns False, changing nothing, when it is
    already there: the first reason, job and reply are kept."""
    address = check_email(email).lower()
    check_reason(reason)
    text_limits.check("note", note, text_limits.SUPPRESSION_NOTE)
    row = conn.execute(sa.text("""
        INSERT INTO suppressions (email, reason, job_id, reply, note, created_by)
        VALUES (:email, :reason, :job_id, :reply, :note, :actor)
        ON CONFLICT (email) DO NOTHING RETURNING email"""),
        {"email": address, "reason": reason, "job_id": job_id, "reply": reply,
         "note": note, "actor": actor}).first()
    if row is None:
        return False
    audit.record(conn, actor, "suppression.add", address, reason=reason, note=note,
                 job_id=job_id)
    return True


def get(conn: Connection, email: str) -> dict[str, Any] | None:
    row = conn.execute(sa.text("SELECT * FROM suppressions WHERE email = lower(:e)"),
                       {"e": email.strip()}).mappings().first()
    return dict(row) if row else None


# --- reading: keyset pages -------------------------------------------------------------

@dataclass
class Page:
    """One page of entries and the cursor of the next one (None on the last page)."""

    rows: list[dict[str, Any]]
    next_cursor: str | None


# A page cursor: the last entry's creation time (microseconds since 1970, UTC) and address.
# One shape for both orders (newest first uses both parts, by address only the address),
# so any cursor of this shape is a valid place to continue from.
CURSOR = "^-?[0-9]{1,16}\\|[^\\x00]*$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _cursor(row: dict[str, Any], by_email: bool) -> str:
    micros = (row["created_at"] - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}|{row['email']}"


def check_cursor(cursor: str | None) -> None:
    """Refuse (422) a page cursor that :func:`_cursor` cannot have made."""
    if cursor and not re.search(CURSOR, cursor):
        raise Invalid(N_("that page link is broken; start again from the first page"),
                      fields={"after": N_("invalid cursor")})


def _after(cursor: str | None, by_email: bool) -> tuple[str, dict[str, Any]]:
    """The keyset condition for ``cursor`` (made by :func:`_cursor`)."""
    if not cursor:
        return "", {}
    check_cursor(cursor)
    micros, email = cursor.split("|", 1)
    if by_email:
        return " AND s.email ~>~ :after_email", {"after_email": email}
    return (" AND (s.created_at, s.email) < (:after_at, :after_email)",
            {"after_at": _EPOCH + timedelta(microseconds=int(micros)), "after_email": email})


def search(conn: Connection, *, query: str | None = None, reason: str | None = None,
           after: str | None = None, limit: int = PAGE_SIZE) -> Page:
    """Entries, newest first, or — with ``query`` — those whose address contains it (a
    fragment, a domain such as ``example.net`` or ``@example.net``), in address order. Pages
    are keyset (no OFFSET); a search goes through the trigram index."""
    query = (query or "").strip().lower()
    by_email = bool(query)
    clauses: list[str] = []
    params: dict[str, Any] = {"limit": limit + 1}
    if reason:
        clauses.append("s.reason = :reason")
        params["reason"] = check_reason(reason)
    if by_email:
        clauses.append("s.email LIKE :pattern")
        params["pattern"] = _contains(query)
    after_sql, after_params = _after(after, by_email)
    params.update(after_params)
    where = " AND ".join(clauses) or "true"
    order = "s.email USING ~<~" if by_email else "s.created_at DESC, s.email DESC"
    rows = [dict(r) for r in conn.execute(sa.text(f"""
        SELECT s.email, s.reason, s.job_id, s.reply, s.note, s.created_by, s.created_at,
               s.reason_code, j.kind AS job_kind, j.campaign_id, c.name AS campaign_name
          FROM suppressions s
          LEFT JOIN delivery_jobs j ON j.id = s.job_id
          LEFT JOIN campaigns c ON c.id = j.campaign_id
         WHERE {where}{after_sql}
         ORDER BY {order} LIMIT :limit"""), params).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, _cursor(rows[-1], by_email) if more and rows else None)


def _contains(query: str) -> str:
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def count(conn: Connection, *, query: str | None = None, reason: str | None = None) -> int:
    """Exactly how many entries match (the same conditions as :func:`search`)."""
    query = (query or "").strip().lower()
    clauses, params = [], {}
    if reason:
        clauses.append("reason = :reason")
        params["reason"] = check_reason(reason)
    if query:
        clauses.append("email LIKE :pattern")
        params["pattern"] = _contains(query)
    where = " AND ".join(clauses) or "true"
    return int(conn.execute(sa.text(f"SELECT count(*) FROM suppressions WHERE {where}"),
                            params).scalar_one())


def export_rows(conn: Connection, *, query: str | None = None, reason: str | None = None,
                batch: int = 5000) -> Iterator[list[Any]]:
    """Every matching entry (header first) for a CSV export, read a page at a time."""
    yield ["email", "reason", "created_at", "created_by", "note", "job_id", "reply"]
    after: str | None = None
    while True:
        page = search(conn, query=query, reason=reason, after=after, limit=batch)
        for r in page.rows:
            yield [r["email"], r["reason"], r["created_at"].isoformat(), r["created_by"] or "",
                   r["note"], r["job_id"] or "", r["reply"] or ""]
        if page.next_cursor is None:
            return
        after = page.next_cursor


# --- adding many, clearing -------------------------------------------------------------

_SPLIT = re.compile(r"[\s,;]+")


def parse_addresses(text: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Addresses pasted one per line (or separated by commas/semicolons/spaces): the valid
    ones lower-cased and de-duplicated, and one error per line holding anything that is
    not an address, with its number and the line as typed (it goes back to the box whole,
    to be fixed; the addresses on it are saved all the same)."""
    valid: dict[str, None] = {}
    errors: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        items = [item for item in _SPLIT.split(line.strip()) if item]
        good: list[str] = []
        bad: list[tuple[str, str]] = []
        for item in items:
            try:
                good.append(check_email(item).lower())
            except Invalid as exc:
                bad.append((item, exc.message))
        valid.update(dict.fromkeys(good))
        if not bad:
            continue
        if not good:  # words, not a list of addresses: the line is one bad value
            try:
                check_email(line.strip())
                error = bad[0][1]
            except Invalid as exc:
                error = exc.message
        else:
            error = N_("“%(value)s”: %(error)s", value=bad[0][0][:200], error=bad[0][1])
        errors.append({"line": number, "value": line, "error": error})
    if len(valid) > MAX_PASTE:
        raise Invalid(N_("at most %(max)s addresses at once; split the list", max=MAX_PASTE),
                      fields={"emails": N_("too many")})
    return list(valid), errors


# Set-based: insert the new addresses and write one audit entry per address actually
# added, in one statement; addresses already on the list keep their first reason.
_ADD_MANY = sa.text("""
WITH ins AS (
    INSERT INTO suppressions (email, reason, note, created_by)
    SELECT e, :reason, :note, :actor FROM unnest(CAST(:emails AS text[])) AS e
    ON CONFLICT (email) DO NOTHING
    RETURNING email
), logged AS (
    INSERT INTO audit_log (actor, action, target, details)
    SELECT :actor, 'suppression.add', email,
           jsonb_build_object('reason', CAST(:reason AS text), 'note', CAST(:note AS text))
      FROM ins
)
SELECT email FROM ins
""")


def add_many(conn: Connection, text: str, *, reason: str = "manual", note: str = "",
             actor: str) -> dict[str, Any]:
    """Suppress every valid address in ``text``. Returns ``added`` (new entries),
    ``already`` (were on the list) and ``errors`` (line, value, error): bad lines are
    reported and the rest are saved (P9)."""
    check_reason(reason)
    text_limits.check("note", note, text_limits.SUPPRESSION_NOTE)
    emails, errors = parse_addresses(text)
    if not emails and not errors:
        raise Invalid(N_("paste at least one address"), fields={"emails": N_("required")})
    added = set(conn.execute(_ADD_MANY, {"emails": emails, "reason": reason,
                                         "note": note.strip(), "actor": actor}).scalars())
    return {"added": [e for e in emails if e in added],
            "already": [e for e in emails if e not in added], "errors": errors}


# Set-based: delete the entries, log one audit entry per address cleared (with the reason
# it had), and make subscribers who had unsubscribed active again, so the next campaign
# includes every cleared address.
_CLEAR = sa.text("""
WITH gone AS (
    DELETE FROM suppressions WHERE email = ANY(CAST(:emails AS text[]))
    RETURNING email, reason, job_id
), logged AS (
    INSERT INTO audit_log (actor, action, target, details)
    SELECT :actor, 'suppression.clear', email,
           jsonb_build_object('note', CAST(:note AS text), 'reason', reason, 'job_id', job_id)
      FROM gone
), resubscribed AS (
    UPDATE subscribers SET status = 'active'
     WHERE lower(email) IN (SELECT email FROM gone) AND status = 'unsubscribed'
)
SELECT email, reason FROM gone
""")


def clear(conn: Connection, emails: list[str], note: str, actor: str) -> list[str]:
    """Take ``emails`` off the list; returns the addresses that were on it."""
    wanted = sorted({e.strip().lower() for e in emails if e and e.strip()})
    if not wanted:
        raise Invalid(N_("select at least one address to clear"),
                      fields={"emails": N_("required")})
    text_limits.check("note", note, text_limits.SUPPRESSION_NOTE)
    rows = conn.execute(_CLEAR, {"emails": wanted, "note": note.strip(), "actor": actor})
    return sorted(r.email for r in rows)
