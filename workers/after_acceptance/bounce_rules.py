"""Bounce rules (docs/design.md §36): an admin's correction of how a bounce was read, kept as
a reply pattern → a reason, deciding every later bounce or complaint whose text holds the
pattern, from every source (the bounce mailbox and each provider's webhook).

A pattern is plain text, matched case-insensitively with each run of white space (ASCII:
space, tab, line breaks) read as one space. No regular expressions: a rule can never be
slow, and an admin can see at a glance what it matches. When several rules match, the
longest pattern wins (the most specific), then the newest. What a rule's reason does is
what the reader's would have done
(:func:`~workers.after_acceptance.bounces.reasons.effect_of`): a hard reason suppresses, a
soft one counts toward the soft-bounce limit, a sender reason raises the sender alarm, a
complaint suppresses and counts toward the campaign's complaint rate, and an ignored one
(``vacation``, ``delivered``) is kept on the job and does nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.after_acceptance.bounces import reasons as rs
from workers.after_acceptance.bounces.read import Failure
from workers.after_acceptance.reports import Feedback

MIN_PATTERN, MAX_PATTERN = 3, 500  # characters other than white space; all characters
_SPACE = re.compile(r"[ \t\r\n\f\v]+")
#: What a pattern must be (the API's schema says the same): no NUL, and at least
#: MIN_PATTERN characters that are not white space.
VALID = "^(?:[ \\t\\r\\n\\f\\v]*[^ \\t\\r\\n\\f\\v\\x00]){" + str(MIN_PATTERN) + "}[^\\x00]*$"


def normalize(text: str) -> str:
    """The form patterns are stored and matched in: each run of white space one space, none
    at either end (case is ignored by the match itself)."""
    return _SPACE.sub(" ", text).strip(" ")


def substantial(pattern: str) -> bool:
    """At least MIN_PATTERN characters other than white space."""
    return len(_SPACE.sub("", pattern)) >= MIN_PATTERN


@dataclass(frozen=True)
class Rule:
    id: int
    pattern: str
    reason: str


# The longest matching pattern, then the newest (bounce_rules is small: an admin's list).
_MATCH = sa.text("""
SELECT id, pattern, reason FROM bounce_rules
 WHERE strpos(lower(:text), lower(pattern)) > 0
 ORDER BY char_length(pattern) DESC, id DESC
 LIMIT 1
""")

_HIT = sa.text("UPDATE bounce_rules SET hits = hits + 1, last_hit_at = now() WHERE id = :id")


def find(conn: Connection, text: str) -> Rule | None:
    """The rule that decides a bounce with this text, if any."""
    wanted = normalize(text)
    if len(wanted) < MIN_PATTERN:
        return None
    row = conn.execute(_MATCH, {"text": wanted}).first()
    return None if row is None else Rule(int(row.id), str(row.pattern), str(row.reason))


def count_hit(conn: Connection, rule: Rule) -> None:
    conn.execute(_HIT, {"id": rule.id})


_BOUNCE = {rs.HARD: "hard", rs.SOFT: "soft", rs.SENDER: "sender"}


def effect(reason: str, feedback: Feedback) -> str:
    """What ``reason`` does to this event: hard, soft, sender, complaint or ignore."""
    found = rs.effect_of(reason, feedback.status, feedback.reason)
    return rs.SOFT if found == rs.DELAY else found


def decided(feedback: Feedback, reason: str) -> Feedback:
    """The event as ``reason`` reads it: its type and bounce class follow the reason's
    effect (an ignored one is a ``bounce`` with no class, which does nothing)."""
    found = effect(reason, feedback)
    if found == rs.COMPLAINT:
        return replace(feedback, type="complaint", bounce=None, code=reason)
    return replace(feedback, type="bounce", bounce=_BOUNCE.get(found), code=reason)


def from_ignored(failure: Failure, message_id: str | None, rule: Rule) -> Feedback | None:
    """A failure the reader set aside (an auto-reply, a delay, a delivery notice) that a rule
    says is something else: the event it is, or None when the rule ignores it too."""
    text = (failure.diagnostic or failure.label)[:1000]
    event = decided(Feedback("bounce", failure.recipient, None, text, failure.status or None,
                             message_id, code=failure.reason), rule.reason)
    return None if event.type == "bounce" and event.bounce is None else event
