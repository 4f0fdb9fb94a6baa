"""Bounce review (docs/design.md §36): admins read how each bounce and complaint was read,
with its reply text, and correct one; the correction becomes a rule (a reply pattern → a
reason) that decides later bounces (:mod:`workers.after_acceptance.bounce_rules`).

Correcting an event also makes its own consequences follow the new reading, in the same
transaction, audited:

- read as suppressing (a hard bounce, a complaint) and corrected to something that does not:
  the suppression this event's job made is lifted (one an admin added, or another job made,
  stays);
- the other way round: the address is suppressed, and a ``sent`` job becomes ``bounced``;
- a complaint corrected away no longer counts toward its campaign's complaint rate, and
  one corrected into a complaint counts (once per job, as always).

A job already ``bounced`` stays so (the queue never moves a job back to ``sent``): it did
fail to arrive, whatever the reason was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit, text_limits
from webapp.domain.errors import Invalid, NotFound
from workers import queue
from workers.after_acceptance import bounce_rules
from workers.after_acceptance.bounces import VOCABULARY
from workers.after_acceptance.reports import Feedback
from workers.core.i18n import N_
from workers.core.states import SENT

PAGE_SIZE = 50
MAX_SEARCH = audit.MAX_FILTER

#: The review page's "Show" filter: what the event did (or that an admin corrected it).
SHOWN = ("hard", "soft", "sender", "complaint", "ignored", "ruled", "corrected")


@dataclass
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None


_ADDRESS = re.compile(r"<[^<>\s]*>|[\w.+'=-]+@[\w.-]+|\[[0-9a-f.:]+\]", re.IGNORECASE)
_IDS = re.compile(r"\b(?=[\w-]*\d)[\w-]{12,}\b")  # queue ids, tracking tokens


def suggest_pattern(reply: str) -> str:
    """A pattern for a correction: the longest stretch of the reply that names no address,
    IP or queue id, so that it matches the same reply about someone else."""
    pieces = [bounce_rules.normalize(p).strip(" :;,.()'\"")
              for part in _IDS.split(_ADDRESS.sub("\n", reply)) for p in part.split("\n")]
    best = max(pieces, key=len, default="")[:200].strip(" ")
    return best if bounce_rules.substantial(best) else ""


def check_reason(reason: str) -> str:
    if reason not in VOCABULARY:
        raise Invalid(N_("reason must be one of %(choices)s", choices=", ".join(VOCABULARY)),
                      fields={"reason": N_("unknown reason")})
    return reason


def check_pattern(pattern: str) -> str:
    """The pattern as stored (white space collapsed); Invalid when it has fewer than
    MIN_PATTERN characters other than white space, more than MAX_PATTERN, or a NUL."""
    wanted = bounce_rules.normalize(pattern)
    if not bounce_rules.substantial(wanted) or "\x00" in wanted:
        raise Invalid(N_("a pattern needs at least %(min)s characters",
                         min=str(bounce_rules.MIN_PATTERN)),
                      fields={"pattern": N_("too short")})
    if len(wanted) > bounce_rules.MAX_PATTERN:
        raise Invalid(N_("at most %(max)s characters", max=str(bounce_rules.MAX_PATTERN)),
                      fields={"pattern": N_("too long")})
    return wanted


# --- reading -----------------------------------------------------------------------------

_EVENTS = sa.text("""
SELECT e.id, e.job_id, e.source, e.type, e.bounce, e.email, e.reason AS reply, e.status,
       e.effect, e.reason_code, e.read_as, e.rule_id, e.corrected_at, e.created_at,
       r.pattern AS rule_pattern, j.kind AS job_kind, c.name AS campaign_name
  FROM job_events e
  LEFT JOIN bounce_rules r ON r.id = e.rule_id
  LEFT JOIN delivery_jobs j ON j.id = e.job_id
  LEFT JOIN campaigns c ON c.id = j.campaign_id
 WHERE (CAST(:before AS bigint) IS NULL OR e.id < :before)
   AND (CAST(:reason AS text) IS NULL OR e.reason_code = :reason)
   AND (CAST(:shown AS text) IS NULL
        OR (:shown = 'complaint' AND e.type = 'complaint')
        OR (:shown = 'ignored' AND e.type = 'bounce' AND e.bounce IS NULL)
        OR (:shown = 'ruled' AND e.rule_id IS NOT NULL AND e.corrected_at IS NULL)
        OR (:shown = 'corrected' AND e.corrected_at IS NOT NULL)
        OR (e.type = 'bounce' AND e.bounce = :shown))
   AND (CAST(:q AS text) IS NULL OR lower(e.email) LIKE '%' || :q || '%'
        OR lower(e.reason) LIKE '%' || :q || '%')
 ORDER BY e.id DESC
 LIMIT :limit
""")


def _like(text: str) -> str:
    return text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def events(conn: Connection, *, shown: str | None = None, reason: str | None = None,
           query: str | None = None, after: str | None = None,
           limit: int = PAGE_SIZE) -> Page:
    """Bounces and complaints, newest first, ``limit`` per page (``after``: the cursor)."""
    if shown is not None and shown not in SHOWN:
        raise Invalid(N_("unknown filter"), fields={"show": N_("unknown filter")})
    if reason is not None:
        check_reason(reason)
    if query is not None and len(query) > MAX_SEARCH:
        raise Invalid(N_("at most %(max)s characters", max=str(MAX_SEARCH)),
                      fields={"q": N_("at most %(max)s characters", max=str(MAX_SEARCH))})
    before = int(after) if after and after.isdigit() else None
    rows = [dict(r) for r in conn.execute(_EVENTS, {
        "before": before, "reason": reason, "shown": shown,
        "q": _like(query) if query else None, "limit": limit + 1}).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    for row in rows:
        row["suggested"] = suggest_pattern(row["reply"] or "")
    return Page(rows, str(rows[-1]["id"]) if more and rows else None)


def rules(conn: Connection, rule_id: int | None = None) -> list[dict[str, Any]]:
    """Every rule (or the one ``rule_id`` names), the most specific (longest) first: the
    order they are tried in."""
    return [dict(r) for r in conn.execute(sa.text("""
        SELECT id, pattern, reason, note, created_by, from_event_id, hits, last_hit_at,
               created_at
          FROM bounce_rules WHERE CAST(:id AS bigint) IS NULL OR id = :id
         ORDER BY char_length(pattern) DESC, id DESC"""), {"id": rule_id}).mappings()]


def export(conn: Connection) -> list[dict[str, Any]]:
    """The rules as JSON-ready records (``senddock``'s review page offers them as a file)."""
    return [{"pattern": r["pattern"], "reason": r["reason"], "note": r["note"],
             "created_by": r["created_by"], "created_at": r["created_at"].isoformat(),
             "hits": r["hits"]} for r in rules(conn)]


# --- writing -----------------------------------------------------------------------------

_UPSERT_RULE = sa.text("""
INSERT INTO bounce_rules (pattern, reason, note, created_by, from_event_id)
VALUES (:pattern, :reason, :note, :actor, :event_id)
ON CONFLICT ((lower(pattern))) DO UPDATE
   SET pattern = EXCLUDED.pattern, reason = EXCLUDED.reason, note = EXCLUDED.note,
       created_by = EXCLUDED.created_by, from_event_id = EXCLUDED.from_event_id, created_at = now()
RETURNING id, (xmax = 0) AS created
""")


def add_rule(conn: Connection, pattern: str, reason: str, note: str, actor: str, *,
             event_id: int | None = None) -> int:
    """Keep a rule (one with the same pattern is replaced); returns its id. The three
    fields must be text (a JSON body may carry anything)."""
    for name, value in (("pattern", pattern), ("reason", reason), ("note", note)):
        if not isinstance(value, str):
            raise Invalid(N_("%(field)s must be a string", field=name),
                          fields={name: N_("must be a string")})
    wanted, reason = check_pattern(pattern), check_reason(reason)
    text_limits.check("note", note, text_limits.SUPPRESSION_NOTE)
    row = conn.execute(_UPSERT_RULE, {"pattern": wanted, "reason": reason,
                                      "note": note.strip(), "actor": actor,
                                      "event_id": event_id}).one()
    audit.record(conn, actor, "bounce_rule.add" if row.created else "bounce_rule.change",
                 f"bounce_rule:{row.id}", pattern=wanted, reason=reason, note=note.strip(),
                 event_id=event_id)
    return int(row.id)


def delete_rule(conn: Connection, rule_id: int, actor: str) -> None:
    row = conn.execute(sa.text("DELETE FROM bounce_rules WHERE id = :id "
                               "RETURNING pattern, reason, hits"), {"id": rule_id}).first()
    if row is None:
        raise NotFound(N_("That rule does not exist (any more)."))
    audit.record(conn, actor, "bounce_rule.delete", f"bounce_rule:{rule_id}",
                 pattern=row.pattern, reason=row.reason, hits=row.hits)


_EVENT = sa.text("""
SELECT e.id, e.job_id, e.type, e.bounce, e.reason, e.status, e.reason_code, e.effect,
       coalesce(j.email, e.email) AS address, j.status AS job_status, j.broadcast_id
  FROM job_events e LEFT JOIN delivery_jobs j ON j.id = e.job_id
 WHERE e.id = :id
   FOR UPDATE OF e
""")

_RELABEL = sa.text("""
UPDATE job_events
   SET type = :type, bounce = :bounce, reason_code = :code, rule_id = :rule_id,
       read_as = coalesce(read_as, reason_code), corrected_at = now()
 WHERE id = :id
""")

_LIFT = sa.text("""
DELETE FROM suppressions
 WHERE email = lower(:email) AND job_id = :job_id AND created_by LIKE 'system:%'
RETURNING email
""")

_SUPPRESS = sa.text("""
INSERT INTO suppressions (email, reason, job_id, reply, created_by, reason_code, note)
VALUES (lower(:email), :reason, :job_id, :reply, :actor, :code, :note)
ON CONFLICT (email) DO NOTHING
RETURNING email
""")

_COMPLAINTS_ON_JOB = sa.text(
    "SELECT count(*) FROM job_events WHERE job_id = :job_id AND type = 'complaint'")

_COUNT = sa.text("UPDATE broadcasts SET complaints = greatest(complaints + :by, 0) "
                 "WHERE id = :id")


def _suppresses(kind: str, bounce: str | None) -> bool:
    return kind == "complaint" or bounce == "hard"


@dataclass(frozen=True)
class Correction:
    event_id: int
    rule_id: int
    reason: str
    suppression: str  # "lifted", "added" or "" (unchanged)


def correct(conn: Connection, event_id: int, reason: str, pattern: str, note: str,
            actor: str) -> Correction:
    """Read event ``event_id`` as ``reason`` from now on, and every later bounce whose text
    holds ``pattern`` too (see the module docstring for what changes with it)."""
    event = conn.execute(_EVENT, {"id": event_id}).mappings().first()
    if event is None:
        raise NotFound(N_("That bounce does not exist (any more)."))
    wanted, reason = check_pattern(pattern), check_reason(reason)
    if wanted.lower() not in bounce_rules.normalize(event["reason"] or "").lower():
        raise Invalid(N_("the pattern must be part of this bounce's reply, so that the rule "
                         "matches it"), fields={"pattern": N_("not in the reply")})
    rule_id = add_rule(conn, wanted, reason, note, actor, event_id=event_id)
    now = bounce_rules.decided(Feedback(event["type"], event["address"], event["bounce"],
                                        event["reason"] or "", event["status"]), reason)
    conn.execute(_RELABEL, {"type": now.type, "bounce": now.bounce, "code": reason,
                            "rule_id": rule_id, "id": event_id})
    before = _suppresses(event["type"], event["bounce"])
    after = _suppresses(now.type, now.bounce)
    suppression = ""
    job_id = event["job_id"]
    if job_id is not None and before and not after:
        if conn.execute(_LIFT, {"email": event["address"], "job_id": job_id}).first():
            suppression = "lifted"
    elif job_id is not None and after and not before:
        if conn.execute(_SUPPRESS, {
                "email": event["address"], "job_id": job_id, "actor": actor, "code": reason,
                "reason": "complaint" if now.type == "complaint" else "bounced",
                "reply": (event["reason"] or "")[:1000], "note": note.strip()}).first():
            suppression = "added"
        if now.bounce == "hard" and event["job_status"] == SENT:
            queue.bounce_sent(conn, job_id, (event["reason"] or "")[:1000])
    if job_id is not None and event["broadcast_id"] is not None \
            and (event["type"] == "complaint") != (now.type == "complaint"):
        others = int(conn.execute(_COMPLAINTS_ON_JOB, {"job_id": job_id}).scalar() or 0)
        if now.type == "complaint" and others == 1:
            conn.execute(_COUNT, {"by": 1, "id": event["broadcast_id"]})
        elif now.type != "complaint" and others == 0:
            conn.execute(_COUNT, {"by": -1, "id": event["broadcast_id"]})
    audit.record(conn, actor, "bounce.correct", event["address"], event_id=event_id,
                 job_id=job_id, was=event["reason_code"], now=reason, rule_id=rule_id,
                 suppression=suppression, note=note.strip())
    return Correction(event_id, rule_id, reason, suppression)
