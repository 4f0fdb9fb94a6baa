"""Segments (docs/design.md §20): a list narrowed by conditions, saved and reused.

A condition is ``{"field", "op", "key"?, "value"?}``; all of a segment's conditions must
hold. The fields and operators are a fixed table (``workers.queue.audience``):

- ``attribute`` (``key`` names the subscriber attribute): ``eq``, ``ne``, ``contains``
  (a string), ``in``, ``not_in`` (a list of strings), ``exists``, ``missing``;
- ``subscribed`` (when the subscriber joined the list, UTC days): ``after`` (on or after
  the day), ``before``;
- ``activity`` (opens and clicks from tracking): ``opened``, ``clicked``, ``not_opened``,
  ``not_clicked`` in the last ``value`` days (1-3650).

Guarantees kept here:

- every condition is checked before it is saved, counted or sent, and a bad one is answered
  with its index, its field and a sentence saying what is expected (P9);
- no SQL is ever built from what a marketer typed: :func:`validate` returns the canonical
  JSON, and ``workers.queue.audience.predicate`` turns it into whitelisted fragments with
  bound values — the same function the enqueue uses, so the live count and the send agree;
- activity conditions read the open and click events that tracking records
  (``campaign_events``, webapp.domain.tracking): only campaigns sent with tracking on
  leave any, which the segments page says.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit, lists, text_limits
from webapp.domain.errors import Conflict, Invalid, NotFound
from workers.core.i18n import N_, Text
from workers.core.states import Campaign, sql_list
from workers.queue import audience

MAX_NAME = text_limits.SEGMENT_NAME
MAX_VALUE = 500
MAX_CHOICES = 1000
MAX_KEY = 100
# A day as YYYY-MM-DD, year 0001 to 9999 (what the API's schema says, exactly).
DATE_PATTERN = ("^([1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-(0[1-9]|1[0-2])-"
                "(0[1-9]|[12][0-9]|3[01])$")
DATE = re.compile(DATE_PATTERN)
# The combined choice the pages offer ("attribute:eq"), as the UI names each.
CHOICES: dict[str, Text] = {
    "attribute:eq": N_("attribute is"),
    "attribute:ne": N_("attribute is not"),
    "attribute:in": N_("attribute is one of"),
    "attribute:not_in": N_("attribute is none of"),
    "attribute:contains": N_("attribute contains"),
    "attribute:exists": N_("attribute is set"),
    "attribute:missing": N_("attribute is not set"),
    "subscribed:after": N_("joined the list on or after"),
    "subscribed:before": N_("joined the list before"),
    "activity:opened": N_("opened a campaign in the last N days"),
    "activity:clicked": N_("clicked in a campaign in the last N days"),
    "activity:not_opened": N_("opened nothing in the last N days"),
    "activity:not_clicked": N_("clicked nothing in the last N days"),
}


def _bad(index: int, part: str, message: Text) -> Invalid:
    where = f"conditions[{index}].{part}"
    return Invalid(N_("condition %(number)s: %(message)s", number=index + 1, message=message),
                   fields={where: message})


def _scalar(index: int, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise _bad(index, "value", N_("a value is needed"))
    if len(value) > MAX_VALUE:  # as sent (the API's maxLength), then trimmed
        raise _bad(index, "value", N_("at most %(max)s characters", max=MAX_VALUE))
    return value.strip()


def _attribute(index: int, op: str, raw: dict[str, Any]) -> dict[str, Any]:
    key = raw.get("key")
    if not isinstance(key, str) or not key.strip():
        raise _bad(index, "key", N_("name the attribute (a CSV column, e.g. plan)"))
    if len(key) > MAX_KEY:
        raise _bad(index, "key", N_("at most %(max)s characters", max=MAX_KEY))
    condition: dict[str, Any] = {"field": "attribute", "key": key.strip(), "op": op}
    value = raw.get("value")
    if op in audience.NO_VALUE_OPS:
        return condition
    if op in audience.LIST_OPS:
        if not isinstance(value, list) or not value:
            raise _bad(index, "value", N_("give one or more values, separated by commas"))
        if len(value) > MAX_CHOICES:
            raise _bad(index, "value", N_("at most %(max)s values", max=MAX_CHOICES))
        condition["value"] = [_scalar(index, v) for v in value]
        return condition
    condition["value"] = _scalar(index, value)
    return condition


def _subscribed(index: int, op: str, raw: dict[str, Any]) -> dict[str, Any]:
    value = raw.get("value")
    try:
        day = date.fromisoformat(value) if isinstance(value, str) and \
            DATE.fullmatch(value) else None
    except ValueError:
        day = None
    if day is None:
        raise _bad(index, "value", N_("a date like 2026-01-31"))
    return {"field": "subscribed", "op": op, "value": day.isoformat()}


def _activity(conn: Connection, index: int, op: str, raw: dict[str, Any]) -> dict[str, Any]:
    value = raw.get("value")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 3650:
        raise _bad(index, "value", N_("a number of days from 1 to 3650"))
    return {"field": "activity", "op": op, "value": value}


def validate(conn: Connection, conditions: Any) -> list[dict[str, Any]]:
    """The conditions in their canonical form, or :class:`Invalid` naming the first bad
    one (``conditions[i].field|op|key|value``) and what it needs."""
    if not isinstance(conditions, list):
        raise Invalid(N_("conditions must be a list"),
                      fields={"conditions": N_("a list of conditions")})
    if len(conditions) > audience.MAX_CONDITIONS:
        raise Invalid(N_("at most %(max)s conditions", max=audience.MAX_CONDITIONS),
                      fields={"conditions": N_("too many")})
    out = []
    for index, raw in enumerate(conditions):
        if not isinstance(raw, dict):
            raise _bad(index, "field", N_("a condition is an object with field and op"))
        unknown = sorted(set(raw) - {"field", "op", "key", "value"})
        if unknown:
            raise _bad(index, unknown[0], N_("unknown part of a condition (a condition has "
                                             "field, op, key and value)"))
        field, op = raw.get("field"), raw.get("op")
        ops = audience.FIELDS.get(field) if isinstance(field, str) else None
        if ops is None:
            raise _bad(index, "field", N_("field must be attribute, subscribed or activity"))
        if not isinstance(op, str) or op not in ops:
            raise _bad(index, "op", N_("op must be one of: %(ops)s", ops=", ".join(ops)))
        if field == "attribute":
            out.append(_attribute(index, op, raw))
        elif field == "subscribed":
            out.append(_subscribed(index, op, raw))
        else:
            out.append(_activity(conn, index, op, raw))
    audience.predicate(out)  # the engine's own check, on what will be stored
    return out


def from_form(rows: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """The page's condition rows (choice like ``attribute:eq``, key, value) as conditions;
    a row whose choice is empty is not a condition. An unknown choice is kept as given,
    so :func:`validate` names it."""
    out = []
    for choice, key, value in rows:
        if not choice.strip():
            continue
        field, _, op = choice.strip().partition(":")
        condition: dict[str, Any] = {"field": field, "op": op, "key": key,
                                     "value": value.strip()}
        if field == "attribute" and op in audience.LIST_OPS:
            condition["value"] = [v for v in (p.strip() for p in value.split(",")) if v]
        elif field == "activity" and value.strip().isdigit() and len(value.strip()) < 6:
            condition["value"] = int(value.strip())
        out.append(condition)
    return out


def as_rows(conditions: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Conditions as the page's rows (lists joined by commas)."""
    rows = []
    for c in conditions:
        value = c.get("value")
        rows.append({"choice": f"{c.get('field')}:{c.get('op')}", "key": str(c.get("key") or ""),
                     "value": ", ".join(map(str, value)) if isinstance(value, list)
                     else "" if value is None else str(value)})
    return rows


_COUNT = """
SELECT count(*) FILTER (WHERE {chosen}) AS members,
       count(*) FILTER (WHERE {chosen} AND x.email IS NOT NULL) AS suppressed,
       count(*) FILTER (WHERE {chosen} AND x.email IS NULL AND s.status <> 'active')
           AS inactive,
       count(*) AS list_members
  FROM memberships m JOIN subscribers s ON s.id = m.subscriber_id
  LEFT JOIN suppressions x ON x.email = lower(s.email)
 WHERE m.list_id = :list_id
"""


def count(conn: Connection, list_id: int, conditions: list[dict[str, Any]]
          ) -> dict[str, int]:
    """Who a send to the list narrowed by ``conditions`` (already validated) would reach
    right now, by the enqueue's own rules and predicate: one message per address,
    suppressed and inactive subscribers left out."""
    chosen, params = audience.predicate(conditions)
    row = conn.execute(sa.text(_COUNT.format(chosen=f"({chosen})")),
                       {**params, "list_id": list_id}).one()
    members, suppressed, inactive = int(row.members), int(row.suppressed), int(row.inactive)
    return {"members": members, "suppressed": suppressed, "inactive": inactive,
            "will_receive": members - suppressed - inactive,
            "list_members": int(row.list_members)}


# --- saved segments ----------------------------------------------------------------------

FIELDS = ("id", "list_id", "name", "conditions", "created_at", "updated_at")


def _name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise Invalid(N_("give the segment a name"), fields={"name": N_("required")})
    if len(name) > MAX_NAME:
        raise Invalid(N_("the name is longer than %(max)s characters", max=MAX_NAME),
                      fields={"name": N_("at most %(max)s characters", max=MAX_NAME)})
    return name.strip()


def _taken(conn: Connection, list_id: int, name: str, segment_id: int | None) -> None:
    clash = conn.execute(sa.text(
        "SELECT id FROM segments WHERE list_id = :l AND lower(name) = lower(:n) "
        "AND id IS DISTINCT FROM :id"), {"l": list_id, "n": name, "id": segment_id}).first()
    if clash is not None:
        raise Conflict(N_("the list already has a segment named “%(name)s”", name=name),
                       fields={"name": N_("already used on this list")})


def get(conn: Connection, segment_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text(f"SELECT {', '.join(FIELDS)} FROM segments WHERE id = :id"),
                       {"id": segment_id}).mappings().first()
    if row is None:
        raise NotFound(N_("segment %(id)s does not exist", id=str(segment_id)))
    return dict(row)


def for_list(conn: Connection, list_id: int) -> list[dict[str, Any]]:
    lists.get_list(conn, list_id)
    return [dict(r) for r in conn.execute(sa.text(
        f"SELECT {', '.join(FIELDS)} FROM segments WHERE list_id = :l ORDER BY lower(name)"),
        {"l": list_id}).mappings()]


def all_segments(conn: Connection) -> list[dict[str, Any]]:
    """Every saved segment with its list's name (the composer's choice)."""
    return [dict(r) for r in conn.execute(sa.text(
        "SELECT g.id, g.list_id, g.name, l.name AS list_name FROM segments g "
        "JOIN lists l ON l.id = g.list_id ORDER BY lower(l.name), lower(g.name)")).mappings()]


def create(conn: Connection, list_id: int, name: Any, conditions: Any, *,
           actor: str = "system") -> dict[str, Any]:
    lists.get_list(conn, list_id)
    name = _name(name)
    checked = validate(conn, conditions)
    _taken(conn, list_id, name, None)
    segment_id = conn.execute(sa.text(
        "INSERT INTO segments (list_id, name, conditions) VALUES (:l, :n, CAST(:c AS jsonb)) "
        "RETURNING id"), {"l": list_id, "n": name, "c": _json(checked)}).scalar_one()
    audit.record(conn, actor, "segment.create", f"segment:{segment_id}", name=name)
    return get(conn, int(segment_id))


def update(conn: Connection, segment_id: int, name: Any, conditions: Any, *,
           actor: str = "system") -> dict[str, Any]:
    """Change a segment. A campaign already sent to it keeps the conditions it was sent
    with (frozen on its broadcast); drafts and scheduled ones use the new ones."""
    current = get(conn, segment_id)
    name = _name(name)
    checked = validate(conn, conditions)
    _taken(conn, current["list_id"], name, segment_id)
    conn.execute(sa.text("UPDATE segments SET name = :n, conditions = CAST(:c AS jsonb), "
                         "updated_at = now() WHERE id = :id"),
                 {"n": name, "c": _json(checked), "id": segment_id})
    audit.record(conn, actor, "segment.update", f"segment:{segment_id}")
    return get(conn, segment_id)


def delete(conn: Connection, segment_id: int, *, actor: str = "system") -> None:
    """Delete a segment no draft or scheduled campaign is about to send to (those would
    silently widen to the whole list); sent campaigns keep their frozen conditions."""
    get(conn, segment_id)
    user = conn.execute(sa.text(
        "SELECT name FROM campaigns WHERE segment_id = :id AND status IN "
        f"{sql_list(Campaign.EDITABLE)} ORDER BY id LIMIT 1"), {"id": segment_id}).first()
    if user is not None:
        raise Conflict(N_("the campaign “%(name)s” is to be sent to this segment; pick "
                          "another audience for it first", name=user.name))
    conn.execute(sa.text("DELETE FROM segments WHERE id = :id"), {"id": segment_id})
    audit.record(conn, actor, "segment.delete", f"segment:{segment_id}")


def check_for_campaign(conn: Connection, list_id: int, segment_id: Any) -> int | None:
    """The segment a campaign to ``list_id`` may use (None: the whole list); NotFound for
    no such segment, Conflict when it is another list's."""
    segment_id = _whole(segment_id)
    if segment_id is None or (segment_id in ("", 0) and not isinstance(segment_id, bool)):
        return None
    if not isinstance(segment_id, int) or isinstance(segment_id, bool):
        raise Invalid(N_("segment_id must be a number"),
                      fields={"segment_id": N_("a segment id or null")})
    segment = conn.execute(sa.text("SELECT list_id FROM segments WHERE id = :id"),
                           {"id": segment_id}).first()
    if segment is None:
        raise NotFound(N_("segment %(id)s does not exist", id=str(segment_id)),
                       fields={"segment_id": N_("no such segment")})
    if segment.list_id != list_id:
        raise Conflict(N_("segment %(id)s belongs to another list", id=str(segment_id)),
                      fields={"segment_id": N_("not a segment of the campaign's list")})
    return segment_id


def _whole(value: Any) -> Any:
    """A JSON number that is a whole number as an int (JSON Schema's integer takes 240.0);
    anything else as it is (a boolean stays a boolean, and is refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _json(value: Any) -> str:
    return json.dumps(value)
