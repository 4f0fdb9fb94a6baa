"""A segment's conditions as a SQL predicate: the one place a marketer's audience rules
become SQL.

Conditions are data (a JSON array, all of them must hold), never SQL: each one picks a
fragment from a fixed table by its field and operator, and every value the marketer typed
(attribute keys included) is a bound parameter. Anything outside the table raises
:class:`BadCondition`, so a row tampered with in the database cannot smuggle SQL either.
The web app validates with clear messages first (``webapp.domain.segments``); the engine
compiles the frozen copy on the broadcast with the same function, so what the composer
counts is what is enqueued.

The predicate reads ``s`` (subscribers) and ``m`` (memberships of the list) and nothing
else, so the enqueue and the live count can put it beside their own joins.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

# field -> operator -> SQL fragment ({k}: the attribute key's parameter, {v}: the value's).
ATTRIBUTE_OPS: dict[str, str] = {
    "eq": "(s.attributes ->> {k}) = {v}",
    "ne": "(s.attributes ->> {k}) IS DISTINCT FROM {v}",
    "in": "(s.attributes ->> {k}) = ANY(CAST({v} AS text[]))",
    "not_in": "NOT coalesce((s.attributes ->> {k}) = ANY(CAST({v} AS text[])), false)",
    "contains": "strpos(lower(s.attributes ->> {k}), lower({v})) > 0",
    "exists": "jsonb_exists(s.attributes, {k})",
    "missing": "NOT jsonb_exists(s.attributes, {k})",
}
# When the subscriber joined this list: on or after the day, or before it (UTC days).
SUBSCRIBED_OPS: dict[str, str] = {
    "after": "m.created_at >= CAST({v} AS date)",
    "before": "m.created_at < CAST({v} AS date)",
}
# Opened or clicked (any campaign) in the last N days. The events come from open/click
# tracking: a table campaign_events(subscriber_id, kind, at) whose kind is
# 'open' or 'click' (webapp.domain.tracking records them); this is the only SQL that reads it.
ACTIVITY_KINDS = {"opened": "open", "clicked": "click"}
ACTIVITY_SQL = ("EXISTS (SELECT 1 FROM campaign_events e WHERE e.subscriber_id = s.id "
                "AND e.kind = {k} AND e.at >= now() - make_interval(days => CAST({v} AS int)))")
ACTIVITY_OPS: dict[str, str] = {
    "opened": ACTIVITY_SQL,
    "clicked": ACTIVITY_SQL,
    "not_opened": "NOT " + ACTIVITY_SQL,
    "not_clicked": "NOT " + ACTIVITY_SQL,
}
FIELDS: dict[str, dict[str, str]] = {"attribute": ATTRIBUTE_OPS,
                                     "subscribed": SUBSCRIBED_OPS,
                                     "activity": ACTIVITY_OPS}
#: Operators whose value is a list of strings / that take no value.
LIST_OPS = frozenset({"in", "not_in"})
NO_VALUE_OPS = frozenset({"exists", "missing"})
MAX_CONDITIONS = 20


class BadCondition(ValueError):
    """A condition outside the fixed table (the web app says why before it gets here)."""


def _value(condition: dict[str, Any]) -> Any:
    field, op, value = condition["field"], condition["op"], condition.get("value")
    if field == "attribute":
        if op in NO_VALUE_OPS:
            return None
        if op in LIST_OPS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise BadCondition(f"{op} needs a list of strings")
            return list(value)
        if not isinstance(value, str):
            raise BadCondition(f"{op} needs a string")
        return value
    if field == "subscribed":
        if isinstance(value, datetime):
            return value.date()
        if isinstance(value, date):
            return value
        if not isinstance(value, str):
            raise BadCondition("a date is needed")
        try:
            return date.fromisoformat(value)
        except ValueError:
            raise BadCondition("a date is needed (YYYY-MM-DD)") from None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 3650:
        raise BadCondition("a number of days from 1 to 3650 is needed")
    return value


def predicate(conditions: Sequence[dict[str, Any]], prefix: str = "seg"
              ) -> tuple[str, dict[str, Any]]:
    """``(sql, params)``: a boolean expression over ``s`` and ``m`` that holds for the
    subscribers every condition picks ("true" for none). Parameter names start with
    ``prefix`` so the caller's own cannot collide."""
    if len(conditions) > MAX_CONDITIONS:
        raise BadCondition(f"at most {MAX_CONDITIONS} conditions")
    parts: list[str] = []
    params: dict[str, Any] = {}
    for i, condition in enumerate(conditions):
        if not isinstance(condition, dict):
            raise BadCondition("a condition is an object")
        ops = FIELDS.get(condition.get("field"))  # type: ignore[arg-type]
        op = condition.get("op")
        if ops is None or not isinstance(op, str) or op not in ops:
            raise BadCondition(f"unknown condition {condition.get('field')!r} "
                               f"{condition.get('op')!r}")
        k, v = f"{prefix}_k{i}", f"{prefix}_v{i}"
        if condition["field"] == "attribute":
            key = condition.get("key")
            if not isinstance(key, str) or not key:
                raise BadCondition("an attribute condition needs a key")
            params[k] = key
        elif condition["field"] == "activity":
            params[k] = ACTIVITY_KINDS[op.removeprefix("not_")]
        value = _value(condition)
        if value is not None:
            params[v] = value
        parts.append("(" + ops[op].format(k=f":{k}", v=f":{v}") + ")")
    return (" AND ".join(parts) or "true"), params
