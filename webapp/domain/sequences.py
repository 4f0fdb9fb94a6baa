"""Sequences (docs/sequences.md): building them, editing them live, events that
enrol or end enrollments, and what support and the funnel read.

Guarantees kept here:

- every field a user gives is checked, and a bad one is refused naming the field (P9);
  an email step's templates must compile;
- a removed step keeps its row (its visits still read); enrollments waiting at it move to
  the next live step, keeping their due time; content edits bump the step's version, so a
  send not yet made renders the edit;
- pausing moves active enrollments to ``paused`` (out of the advancer's index) and
  resuming moves them back; archiving ends the open ones (reason ``archived``);
- an event is recorded and enrols (re-entry rule) in the same transaction; a goal event
  ends the person's open enrollments of the sequences whose goal it is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit, lists, verifications
from webapp.domain import fields as rules
from webapp.domain.errors import Conflict, DomainError, Invalid, NotFound
from workers.building.message import TemplateError, compile_campaign
from workers.core.i18n import N_
from workers.core.states import SENT, Sequence, sql_list

OPEN = sql_list(Sequence.OPEN)
PAUSED = Sequence.PAUSED

MAX_NAME = 200
EVENT_NAME = "^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
TRIGGERS = ("list_add", "list_confirm", "event")
STEP_TYPES = ("email", "wait", "condition")
CONDITION_TESTS = ("attribute", "event", "opened", "clicked")
#: The conditions on the previous email's message, and the tracking each needs.
TRACKED_TESTS = {"opened": "track_opens", "clicked": "track_clicks"}
MAX_WAIT = 366 * 86400
MAX_DATA = 16_384
# Step fields that are left out rather than null (the page leaves out an empty field).
NOT_NULL = ("subject", "wait_seconds", "window_start", "window_end", "condition", "if_false",
            "skip", "position")

SEQUENCE_FIELDS = ("id", "name", "status", "trigger_type", "list_id", "trigger_event",
                   "goal_event", "reentry_days", "from_addr", "layout_id", "track_opens",
                   "track_clicks", "created_at", "updated_at")
STEP_FIELDS = ("id", "position", "type", "subject", "text_body", "html_body", "wait_seconds",
               "window_start", "window_end", "condition", "if_false", "skip", "version")


def _row(row: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    out = {}
    for f in fields:
        value = getattr(row, f)
        out[f] = value.isoformat() if hasattr(value, "isoformat") else value
    return out


def _event_name(raw: Any, field: str, required: bool = True,
                missing: type[DomainError] = Invalid) -> str | None:
    """An event name exactly as given (the OpenAPI pattern, nothing trimmed)."""
    if raw is None:
        if required:
            raise missing(N_("%(field)s is required", field=field),
                          fields={field: N_("required")})
        return None
    if not isinstance(raw, str) or not re.search(EVENT_NAME, raw) or len(raw) > 100:
        problem = N_("1 to 100 letters, digits, '_', '.', ':' or '-'")
        raise Invalid(N_("%(field)s must be %(problem)s", field=field, problem=problem),
                      fields={field: problem})
    return raw.rstrip("\n")


def _int(raw: Any, field: str, low: int, high: int, required: bool = False,
         missing: type[DomainError] = Invalid) -> int | None:
    """A JSON integer from ``low`` to ``high`` (None when absent or null)."""
    if raw is None:
        if required:
            raise missing(N_("%(field)s is required", field=field),
                          fields={field: N_("required")})
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        problem = N_("a whole number from %(low)s to %(high)s", low=low, high=high)
        raise Invalid(N_("%(field)s must be %(problem)s", field=field, problem=problem),
                      fields={field: problem})
    return raw


def _text(raw: Any, field: str, pattern: str = rules.NOT_BLANK,
          required: bool = False, missing: type[DomainError] = Invalid) -> str | None:
    if raw is None:
        if required:
            raise missing(N_("%(field)s is required", field=field),
                          fields={field: N_("required")})
        return None
    if not isinstance(raw, str) or not re.search(pattern, raw):
        raise Invalid(N_("%(field)s must be text that is not blank", field=field),
                      fields={field: N_("invalid")})
    return raw


def _from(raw: Any) -> str | None:
    """A From field: null or blank for SENDDOCK_FROM, an address or Name <address>."""
    if raw is None or (isinstance(raw, str) and re.fullmatch(r"[ ]*", raw)):
        return None
    if not isinstance(raw, str) or rules.CONTROL.search(raw):
        raise Invalid(N_("from_addr must be an address or Name <address>"),
                      fields={"from_addr": N_("invalid")})
    address = raw.rsplit("<", 1)[-1].rstrip(">") if "<" in raw else raw
    if not (re.search(rules.EMAIL, raw) or re.search(rules.NAMED_ADDRESS, raw)):
        raise Invalid(N_("from_addr must be an address or Name <address>"),
                      fields={"from_addr": N_("invalid")})
    try:
        lists.check_email(address.strip())
    except Invalid as exc:
        raise Invalid(exc.message, fields={"from_addr": exc.fields.get("email", "")}) from None
    return raw.strip()


def check_sequence(conn: Connection, data: dict[str, Any],
                   missing: type[DomainError] = Invalid) -> dict[str, Any]:
    """The sequence's fields, checked: a bad field is :class:`Invalid`; one the trigger
    needs and lacks is ``missing`` (a change that would leave it without one: Conflict)."""
    name = data.get("name")
    if not isinstance(name, str) or len(name) > MAX_NAME or not re.search(rules.NOT_BLANK,
                                                                          name):
        raise Invalid(N_("name must be 1 to %(max)s characters", max=MAX_NAME),
                      fields={"name": N_("required")})
    trigger = data.get("trigger_type")
    if trigger not in TRIGGERS:
        raise Invalid(N_("trigger_type must be one of %(choices)s", choices=", ".join(TRIGGERS)),
                      fields={"trigger_type": N_("unknown")})
    event = _event_name(data.get("trigger_event"), "trigger_event", required=False)
    list_id = _int(data.get("list_id"), "list_id", 1, rules.MAX_ID)
    out: dict[str, Any] = {"name": name.strip(), "trigger_type": trigger, "list_id": None,
                           "trigger_event": None}
    if trigger == "event":
        if event is None:
            raise missing(N_("%(field)s is required", field="trigger_event"),
                          fields={"trigger_event": N_("required")})
        out["trigger_event"] = event
    else:
        if list_id is None:
            raise missing(N_("%(field)s is required", field="list_id"),
                          fields={"list_id": N_("required")})
        lists.get_list(conn, list_id)
        out["list_id"] = list_id
    out["goal_event"] = _event_name(data.get("goal_event"), "goal_event", required=False)
    out["reentry_days"] = _int(data.get("reentry_days"), "reentry_days", 0, 36500)
    out["from_addr"] = _from(data.get("from_addr"))
    out["layout_id"] = _int(data.get("layout_id"), "layout_id", 1, rules.MAX_ID)
    for flag in ("track_opens", "track_clicks"):
        value = data.get(flag, False)
        if not isinstance(value, bool):
            raise Invalid(N_("%(field)s must be true or false", field=flag),
                          fields={flag: N_("must be true or false")})
        out[flag] = value
    if out["layout_id"] is not None and conn.execute(sa.text(
            "SELECT 1 FROM layouts WHERE id = :id"), {"id": out["layout_id"]}).first() is None:
        raise NotFound(N_("layout %(id)s not found", id=out["layout_id"]))
    return out


def create_sequence(conn: Connection, data: dict[str, Any], actor: str) -> dict[str, Any]:
    values = check_sequence(conn, data)
    row = conn.execute(sa.text("""
        INSERT INTO sequences (name, trigger_type, list_id, trigger_event, goal_event,
                               reentry_days, from_addr, layout_id, track_opens, track_clicks)
        VALUES (:name, :trigger_type, :list_id, :trigger_event, :goal_event, :reentry_days,
                :from_addr, :layout_id, :track_opens, :track_clicks)
        RETURNING *"""), values).one()
    audit.record(conn, actor, "sequence.create", f"sequence:{row.id}", name=row.name)
    steps = data.get("steps") or []
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise Invalid(N_("steps must be a list of objects"), fields={"steps": N_("invalid")})
    for step in steps:
        add_step(conn, row.id, step, actor)
    return get_sequence(conn, row.id)


def update_sequence(conn: Connection, sequence_id: int, data: dict[str, Any],
                    actor: str) -> dict[str, Any]:
    current = get_sequence(conn, sequence_id, lock=True)
    if current["status"] == "archived":
        raise Conflict(N_("an archived sequence cannot change"))
    values = check_sequence(conn, {**current, **data}, missing=Conflict)
    conn.execute(sa.text("""
        UPDATE sequences SET name = :name, trigger_type = :trigger_type, list_id = :list_id,
               trigger_event = :trigger_event, goal_event = :goal_event,
               reentry_days = :reentry_days, from_addr = :from_addr, layout_id = :layout_id,
               track_opens = :track_opens, track_clicks = :track_clicks, updated_at = now()
         WHERE id = :id"""), {**values, "id": sequence_id})
    audit.record(conn, actor, "sequence.update", f"sequence:{sequence_id}")
    return get_sequence(conn, sequence_id)


def get_sequence(conn: Connection, sequence_id: int, *, lock: bool = False) -> dict[str, Any]:
    row = conn.execute(sa.text("SELECT * FROM sequences WHERE id = :id"
                               + (" FOR UPDATE" if lock else "")),
                       {"id": sequence_id}).first()
    if row is None:
        raise NotFound(N_("sequence %(id)s not found", id=sequence_id))
    out = _row(row, SEQUENCE_FIELDS)
    out["steps"] = steps_of(conn, sequence_id)
    return out


def steps_of(conn: Connection, sequence_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(sa.text(
        "SELECT * FROM sequence_steps WHERE sequence_id = :id AND removed_at IS NULL "
        "ORDER BY position, id"), {"id": sequence_id})
    return [_row(r, STEP_FIELDS) for r in rows]


def list_sequences(conn: Connection) -> list[dict[str, Any]]:
    rows = conn.execute(sa.text(f"""
        SELECT q.*, (SELECT count(*) FROM sequence_enrollments e
                      WHERE e.sequence_id = q.id AND e.status IN {OPEN})
                   AS open_enrollments
          FROM sequences q ORDER BY q.status = 'archived', q.id DESC"""))
    return [{**_row(r, SEQUENCE_FIELDS), "open_enrollments": r.open_enrollments}
            for r in rows]


def _condition(raw: Any) -> dict[str, Any]:
    problem = N_("condition must be {test: attribute, attribute, value}, "
                 "{test: event, event}, {test: opened} or {test: clicked}")
    if not isinstance(raw, dict) or raw.get("test") not in CONDITION_TESTS:
        raise Invalid(problem, fields={"condition": N_("invalid")})
    if raw["test"] in TRACKED_TESTS:
        if set(raw) != {"test"}:
            raise Invalid(problem, fields={"condition": N_("invalid")})
        return {"test": raw["test"]}
    if raw["test"] == "attribute":
        if set(raw) - {"test", "attribute", "value"} or "attribute" not in raw:
            raise Invalid(problem, fields={"condition": N_("invalid")})
        attribute = _text(raw.get("attribute"), "condition.attribute", required=True)
        value = raw.get("value", "")
        if not isinstance(value, str):
            raise Invalid(problem, fields={"condition": N_("invalid")})
        return {"test": "attribute", "attribute": attribute, "value": value}
    if set(raw) - {"test", "event"} or "event" not in raw:
        raise Invalid(problem, fields={"condition": N_("invalid")})
    return {"test": "event", "event": _event_name(raw.get("event"), "condition.event")}


#: What a step may say (anything else is refused, as at the sequence's level): what a
#: step reads back, which a client may send again.
STEP_INPUT = frozenset(STEP_FIELDS) | {"version"}


def check_step(data: dict[str, Any], missing: type[DomainError] = Invalid) -> dict[str, Any]:
    """A step's fields, checked: every field given must be valid whatever the step's
    type (:class:`Invalid`); one its type needs and lacks is ``missing``."""
    if not isinstance(data, dict):
        raise Invalid(N_("a step must be an object"), fields={"step": N_("invalid")})
    unknown = sorted(set(data) - STEP_INPUT)
    if unknown:
        raise Invalid(N_("unknown field(s): %(fields)s", fields=", ".join(unknown)),
                      fields=dict.fromkeys(unknown, N_("unknown field")))
    kind = data.get("type")
    for field in NOT_NULL:
        if field in data and data[field] is None:
            raise Invalid(N_("%(field)s must not be null", field=field),
                          fields={field: N_("invalid")})
    if kind not in STEP_TYPES:
        raise Invalid(N_("type must be one of %(choices)s", choices=", ".join(STEP_TYPES)),
                      fields={"type": N_("unknown")})
    subject = _text(data.get("subject"), "subject")
    bodies = {}
    for field in ("text_body", "html_body"):
        value = data.get(field)
        if value is not None and not isinstance(value, str):
            raise Invalid(N_("%(field)s must be text", field=field),
                          fields={field: N_("invalid")})
        bodies[field] = value or None
    wait = _int(data.get("wait_seconds"), "wait_seconds", 0, MAX_WAIT)
    start = _int(data.get("window_start"), "window_start", 0, 23)
    end = _int(data.get("window_end"), "window_end", 0, 24)
    if (start is None) != (end is None):
        raise Invalid(N_("a window needs a start and an end hour"),
                      fields={"window_end" if end is None else "window_start":
                              N_("required")})
    condition = _condition(data["condition"]) if data.get("condition") is not None else None
    if_false = data.get("if_false")
    if if_false is not None and if_false not in ("exit", "skip"):
        raise Invalid(N_("if_false must be exit or skip"), fields={"if_false": N_("unknown")})
    skip = _int(data.get("skip"), "skip", 1, 100) or 1
    out: dict[str, Any] = dict.fromkeys(("subject", "text_body", "html_body", "wait_seconds",
                                         "window_start", "window_end", "condition",
                                         "if_false"))
    out.update(type=kind, skip=1)
    if kind == "email":
        if subject is None:
            raise missing(N_("subject is required"), fields={"subject": N_("required")})
        if bodies["text_body"] is None and bodies["html_body"] is None:
            raise missing(N_("an email step needs a text or an HTML body"),
                          fields={"text_body": N_("required")})
        try:
            compile_campaign(subject, bodies["text_body"], bodies["html_body"])
        except TemplateError as exc:
            name = {"text": "text_body", "html": "html_body"}.get(exc.field, exc.field)
            raise Invalid(N_("%(field)s does not compile: %(why)s", field=name,
                             why=str(exc)), fields={name: str(exc)}) from None
        out.update(subject=subject, **bodies)
    elif kind == "wait":
        if wait is None:
            raise missing(N_("%(field)s is required", field="wait_seconds"),
                          fields={"wait_seconds": N_("required")})
        # A window from an hour to the same hour is the whole day: no window.
        if start == end:
            start = end = None
        out.update(wait_seconds=wait, window_start=start, window_end=end)
    else:
        if condition is None:
            raise missing(N_("%(field)s is required", field="condition"),
                          fields={"condition": N_("required")})
        out.update(condition=condition, if_false=if_false or "exit", skip=skip)
    return out


def _check_tracked(seq: dict[str, Any], values: dict[str, Any]) -> None:
    """An opened/clicked condition reads the previous email's opens or clicks: refused
    unless the sequence tracks them (it would never hold)."""
    test = (values.get("condition") or {}).get("test")
    if test in TRACKED_TESTS and not seq[TRACKED_TESTS[test]]:
        problem = (N_("turn on open tracking for this sequence first") if test == "opened"
                   else N_("turn on click tracking for this sequence first"))
        raise Invalid(problem, fields={"condition": problem})


def _step_params(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "condition": None if values["condition"] is None
            else json.dumps(values["condition"])}


def add_step(conn: Connection, sequence_id: int, data: dict[str, Any], actor: str,
             position: int | None = None) -> dict[str, Any]:
    """Add a step at the end (or before the live step at ``position``, 1-based)."""
    seq = get_sequence(conn, sequence_id, lock=True)
    if seq["status"] == "archived":
        raise Conflict(N_("an archived sequence cannot change"))
    values = check_step(data)
    _check_tracked(seq, values)
    position = _int(position, "position", 1, rules.MAX_ID)
    count = len(seq["steps"])
    where = count + 1 if position is None else min(position, count + 1)
    conn.execute(sa.text("""
        UPDATE sequence_steps SET position = position + 1
         WHERE sequence_id = :s AND removed_at IS NULL AND position >= :p"""),
        {"s": sequence_id, "p": where})
    row = conn.execute(sa.text("""
        INSERT INTO sequence_steps (sequence_id, position, type, subject, text_body, html_body,
                                    wait_seconds, window_start, window_end, condition,
                                    if_false, skip)
        VALUES (:s, :p, :type, :subject, :text_body, :html_body, :wait_seconds, :window_start,
                :window_end, CAST(:condition AS jsonb), :if_false, :skip)
        RETURNING *"""), {**_step_params(values), "s": sequence_id, "p": where}).one()
    # Enrollments that had run past the last step finished; ones waiting for the step now
    # after this one keep waiting for it (a step inserted before them is behind them).
    audit.record(conn, actor, "sequence.step.add", f"sequence:{sequence_id}", step=row.id)
    return _row(row, STEP_FIELDS)


def _step(conn: Connection, sequence_id: int, step_id: int) -> Any:
    row = conn.execute(sa.text(
        "SELECT * FROM sequence_steps WHERE id = :id AND sequence_id = :s "
        "AND removed_at IS NULL"), {"id": step_id, "s": sequence_id}).first()
    if row is None:
        raise NotFound(N_("step %(id)s not found", id=step_id))
    return row


def update_step(conn: Connection, sequence_id: int, step_id: int, data: dict[str, Any],
                actor: str) -> dict[str, Any]:
    """Change a step's content (its type stays): sends not made yet use the new content."""
    seq = get_sequence(conn, sequence_id, lock=True)
    if seq["status"] == "archived":
        raise Conflict(N_("an archived sequence cannot change"))
    current = _step(conn, sequence_id, step_id)
    given = {k: v for k, v in data.items() if k != "type"}
    stored = {k: v for k, v in _row(current, STEP_FIELDS).items() if v is not None}
    values = check_step({**stored, **given, "type": current.type}, missing=Conflict)
    if "condition" in given:
        _check_tracked(seq, values)
    row = conn.execute(sa.text("""
        UPDATE sequence_steps SET subject = :subject, text_body = :text_body,
               html_body = :html_body, wait_seconds = :wait_seconds,
               window_start = :window_start, window_end = :window_end,
               condition = CAST(:condition AS jsonb), if_false = :if_false, skip = :skip,
               version = version + 1
         WHERE id = :id RETURNING *"""), {**_step_params(values), "id": step_id}).one()
    audit.record(conn, actor, "sequence.step.update", f"sequence:{sequence_id}", step=step_id)
    return _row(row, STEP_FIELDS)


def remove_step(conn: Connection, sequence_id: int, step_id: int, actor: str) -> int:
    """Remove a step; the enrollments waiting at it move to the next live step (or finish at
    the next tick when it was the last). Returns how many moved."""
    if get_sequence(conn, sequence_id, lock=True)["status"] == "archived":
        raise Conflict(N_("an archived sequence cannot change"))
    current = _step(conn, sequence_id, step_id)
    conn.execute(sa.text("UPDATE sequence_steps SET removed_at = now() WHERE id = :id"),
                 {"id": step_id})
    following = conn.execute(sa.text("""
        SELECT id FROM sequence_steps WHERE sequence_id = :s AND removed_at IS NULL
           AND (position, id) > (:p, :id) ORDER BY position, id LIMIT 1"""),
        {"s": sequence_id, "p": current.position, "id": step_id}).scalar()
    moved = conn.execute(sa.text(f"""
        UPDATE sequence_enrollments SET step_id = :next
         WHERE step_id = :id AND status IN {OPEN}"""),
        {"next": following, "id": step_id}).rowcount
    audit.record(conn, actor, "sequence.step.remove", f"sequence:{sequence_id}",
                 step=step_id, moved=moved)
    return int(moved)


def reorder_steps(conn: Connection, sequence_id: int, order: Any, actor: str) -> list[Any]:
    """Put the live steps in ``order`` (every live step id once)."""
    seq = get_sequence(conn, sequence_id, lock=True)
    if seq["status"] == "archived":
        raise Conflict(N_("an archived sequence cannot change"))
    ids = [s["id"] for s in seq["steps"]]
    if not isinstance(order, list) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= rules.MAX_ID
            for i in order):
        raise Invalid(N_("order must be an array of step ids"), fields={"order": N_("invalid")})
    if sorted(order) != sorted(ids):
        raise Conflict(N_("order must list every step of the sequence once"),
                       fields={"order": N_("invalid")})
    conn.execute(sa.text("""
        UPDATE sequence_steps s SET position = o.n
          FROM unnest(CAST(:ids AS bigint[])) WITH ORDINALITY AS o(id, n)
         WHERE s.id = o.id"""), {"ids": [int(i) for i in order]})
    audit.record(conn, actor, "sequence.reorder", f"sequence:{sequence_id}")
    return steps_of(conn, sequence_id)


def set_status(conn: Connection, sequence_id: int, action: str, actor: str) -> dict[str, Any]:
    """``pause``, ``resume`` or ``archive`` the sequence."""
    seq = get_sequence(conn, sequence_id, lock=True)
    moves = {"pause": ("active", "paused"), "resume": ("paused", "active"),
             "archive": (None, "archived")}
    if action not in moves:
        raise Invalid(N_("action must be pause, resume or archive"),
                      fields={"action": N_("unknown")})
    old, new = moves[action]
    if seq["status"] == "archived" or (old is not None and seq["status"] != old):
        raise Conflict(N_("the sequence is %(status)s", status=seq["status"]))
    conn.execute(sa.text("UPDATE sequences SET status = :s, updated_at = now() WHERE id = :id"),
                 {"s": new, "id": sequence_id})
    if action == "archive":
        conn.execute(sa.text(f"""
            UPDATE sequence_enrollments SET status = 'exited', exit_reason = 'archived',
                   finished_at = now()
             WHERE sequence_id = :id AND status IN {OPEN}"""), {"id": sequence_id})
    else:
        conn.execute(sa.text("""
            UPDATE sequence_enrollments SET status = :new
             WHERE sequence_id = :id AND status = :old"""),
            {"id": sequence_id, "old": old, "new": new})
    audit.record(conn, actor, f"sequence.{action}", f"sequence:{sequence_id}")
    return get_sequence(conn, sequence_id)


# --- events ----------------------------------------------------------------------------

#: Events one request may carry (``{"events": [...]}``).
MAX_EVENTS = 1000

# Every event of a request in one statement (docs/sequences.md, "Events"): the people by
# address (found or created, each address once) or by user id (the subscriber of the latest
# event, earlier in the request or stored, that came with both); the events stored; the
# open enrollments whose goal an event is ended; the sequences an event triggers entered
# (the re-entry rule; the unique open index keeps one open enrollment per person). The
# statement's parts see one snapshot, so an event ends and enters as if they were posted
# at the same instant.
_RECORD_EVENTS = sa.text(f"""
WITH given AS (
    SELECT * FROM unnest(CAST(:names AS text[]), CAST(:emails AS text[]),
                         CAST(:users AS text[]), CAST(:datas AS jsonb[]))
           WITH ORDINALITY AS g(name, email, user_ref, data, n)
), added AS (
    INSERT INTO subscribers AS s (email)
    SELECT DISTINCT ON (lower(email)) email FROM given WHERE email IS NOT NULL
     ORDER BY lower(email), n
    ON CONFLICT (lower(email)) DO UPDATE SET email = s.email
    RETURNING s.id, lower(s.email) AS key
), who AS (
    SELECT g.*, nextval(pg_get_serial_sequence('events', 'id')) AS event_id,
           coalesce(a.id,
                    (SELECT a2.id FROM given g2 JOIN added a2 ON a2.key = lower(g2.email)
                      WHERE g.email IS NULL AND g2.user_ref = g.user_ref AND g2.n < g.n
                      ORDER BY g2.n DESC LIMIT 1),
                    (SELECT e.subscriber_id FROM events e
                      WHERE g.email IS NULL AND e.user_ref = g.user_ref
                        AND e.subscriber_id IS NOT NULL ORDER BY e.at DESC LIMIT 1))
               AS subscriber_id
      FROM given g LEFT JOIN added a ON a.key = lower(g.email)
), recorded AS (
    INSERT INTO events (id, name, subscriber_id, user_ref, email, data)
    SELECT event_id, name, subscriber_id, user_ref, email, data FROM who
     WHERE subscriber_id IS NOT NULL
), ended AS (
    UPDATE sequence_enrollments e
       SET status = 'exited', exit_reason = 'goal', finished_at = now()
      FROM sequences s
     WHERE s.id = e.sequence_id AND e.status IN {OPEN}
       AND (s.goal_event, e.subscriber_id) IN (SELECT name, subscriber_id FROM who)
    RETURNING e.id, e.subscriber_id, s.goal_event AS name
), entered AS (
    INSERT INTO sequence_enrollments (sequence_id, subscriber_id, status, step_id, due_at,
                                      data)
    SELECT DISTINCT ON (s.id, w.subscriber_id) s.id, w.subscriber_id,
           CASE WHEN s.status = '{PAUSED}' THEN '{PAUSED}' ELSE 'active' END,
           (SELECT st.id FROM sequence_steps st WHERE st.sequence_id = s.id
               AND st.removed_at IS NULL ORDER BY st.position, st.id LIMIT 1),
           now(), w.data
      FROM who w JOIN sequences s ON s.trigger_event = w.name AND s.status <> 'archived'
     WHERE w.subscriber_id IS NOT NULL
       AND NOT EXISTS (
           SELECT 1 FROM sequence_enrollments e
            WHERE e.sequence_id = s.id AND e.subscriber_id = w.subscriber_id
              AND (e.status IN {OPEN} OR s.reentry_days IS NULL
                   OR e.entered_at > now() - make_interval(days => s.reentry_days)))
     ORDER BY s.id, w.subscriber_id, w.n
    ON CONFLICT DO NOTHING
    RETURNING id, sequence_id, subscriber_id,
              (SELECT trigger_event FROM sequences WHERE id = sequence_id) AS name
)
SELECT 'event' AS what, w.n, w.event_id AS id, w.name, w.subscriber_id, w.user_ref,
       NULL::bigint AS sequence_id FROM who w
UNION ALL SELECT 'ended', NULL, id, name, subscriber_id, NULL, NULL FROM ended
UNION ALL SELECT 'entered', NULL, id, name, subscriber_id, NULL, sequence_id FROM entered
""")


def _check_event(data: Any, at: str = "") -> tuple[str, str | None, str | None, str]:
    """One event's (name, email, user id, data as JSON), checked; ``at`` prefixes the
    fields named in an error (``events[3].``)."""
    if not isinstance(data, dict):
        raise Invalid(N_("%(field)s must be an object", field=at.rstrip(".") or "event"),
                      fields={at.rstrip(".") or "event": N_("invalid")})
    try:
        unknown = sorted(set(data) - {"name", "email", "user_id", "data"})
        if unknown:
            raise Invalid(N_("unknown field(s): %(fields)s", fields=", ".join(unknown)),
                          fields=dict.fromkeys(unknown, N_("unknown field")))
        name = _event_name(data.get("name"), "name")
        assert name is not None
        user_ref = verifications.check_user_id(data["user_id"]) if "user_id" in data \
            else None
        payload = data.get("data", {})
        if not isinstance(payload, dict):
            raise Invalid(N_("data must be an object"), fields={"data": N_("invalid")})
        encoded = json.dumps(payload)
        if len(encoded) > MAX_DATA:
            raise Invalid(N_("data must be at most %(max)s bytes of JSON", max=MAX_DATA),
                          fields={"data": N_("too long")})
        address = lists.check_email(data["email"]) if "email" in data else None
        if address is None and user_ref is None:
            raise Invalid(N_("email or user_id is required"),
                          fields={"email": N_("required")})
    except DomainError as exc:
        if at:
            exc.fields = {at + k: v for k, v in exc.fields.items()}
        raise
    return name, address, user_ref, encoded


def record_events(conn: Connection, items: list[Any]) -> dict[str, Any]:
    """Record events of people (each by ``email`` or ``user_id``), end the enrollments
    whose goal they are and enrol into the sequences they trigger, in one statement. An
    event whose user id has no known subscriber is NotFound (nothing is recorded)."""
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_EVENTS:
        raise Invalid(N_("events must be a list of 1 to %(max)s events", max=MAX_EVENTS),
                      fields={"events": N_("invalid")})
    checked = [_check_event(item, f"events[{i}]." if len(items) > 1 else "")
               for i, item in enumerate(items)]
    rows = conn.execute(_RECORD_EVENTS, {
        "names": [c[0] for c in checked], "emails": [c[1] for c in checked],
        "users": [c[2] for c in checked], "datas": [c[3] for c in checked]}).all()
    events = sorted((r for r in rows if r.what == "event"), key=lambda r: r.n)
    for r in events:
        if r.subscriber_id is None:
            field = "user_id" if len(items) == 1 else f"events[{r.n - 1}].user_id"
            raise NotFound(N_("no subscriber is known for user_id %(user)s; send its email "
                              "once", user=r.user_ref), fields={field: N_("unknown")})
    return {
        "events": [{"id": r.id, "name": r.name, "subscriber_id": r.subscriber_id}
                   for r in events],
        "enrolled": [{"enrollment_id": r.id, "sequence_id": r.sequence_id,
                      "subscriber_id": r.subscriber_id}
                     for r in sorted((r for r in rows if r.what == "entered"),
                                     key=lambda r: r.id)],
        "exited": sorted(r.id for r in rows if r.what == "ended")}


def record_event(conn: Connection, data: dict[str, Any]) -> dict[str, Any]:
    """Record one event of one person (``email`` or ``user_id``): :func:`record_events`
    with one, answered as the event itself."""
    done = record_events(conn, [data])
    (event,) = done["events"]
    return {**event, "enrolled": [{"enrollment_id": e["enrollment_id"],
                                   "sequence_id": e["sequence_id"]}
                                  for e in done["enrolled"]],
            "exited": done["exited"]}


# --- what support and the funnel read --------------------------------------------------

def person(conn: Connection, email: str) -> dict[str, Any]:
    """One person's enrollments, each with its steps' visits (time, job, outcome) and the
    step it waits at: "why did they get step 3 and not step 4"."""
    address = lists.check_email(email)
    sub = conn.execute(sa.text("""
        SELECT s.id, s.email, s.status,
               (SELECT x.reason FROM suppressions x WHERE x.email = lower(s.email))
                   AS suppression
          FROM subscribers s WHERE lower(s.email) = lower(:e)"""), {"e": address}).first()
    if sub is None:
        raise NotFound(N_("no subscriber has the address %(email)s", email=address))
    enrollments = []
    for e in conn.execute(sa.text("""
            SELECT e.*, q.name AS sequence_name, q.status AS sequence_status,
                   st.position AS at_position
              FROM sequence_enrollments e JOIN sequences q ON q.id = e.sequence_id
              LEFT JOIN sequence_steps st ON st.id = e.step_id
             WHERE e.subscriber_id = :s ORDER BY e.entered_at DESC, e.id DESC"""),
            {"s": sub.id}):
        visits = [{"step_id": v.step_id, "position": v.position, "type": v.type,
                   "removed": v.removed, "job_id": v.job_id, "job_status": v.job_status,
                   "at": v.at.isoformat(), "outcome": v.outcome}
                  for v in conn.execute(sa.text("""
            SELECT v.step_id, st.position, st.type, st.removed_at IS NOT NULL AS removed,
                   v.job_id, j.status AS job_status, v.at, v.outcome
              FROM sequence_visits v JOIN sequence_steps st ON st.id = v.step_id
              LEFT JOIN delivery_jobs j ON j.id = v.job_id
             WHERE v.enrollment_id = :e ORDER BY v.at, st.position"""), {"e": e.id})]
        enrollments.append({
            "id": e.id, "sequence_id": e.sequence_id, "sequence_name": e.sequence_name,
            "sequence_status": e.sequence_status, "status": e.status,
            "exit_reason": e.exit_reason, "step_id": e.step_id, "at_position": e.at_position,
            "due_at": e.due_at.isoformat(), "entered_at": e.entered_at.isoformat(),
            "finished_at": e.finished_at and e.finished_at.isoformat(), "data": e.data,
            "visits": visits})
    return {"subscriber": {"id": sub.id, "email": sub.email, "status": sub.status,
                           "suppression": sub.suppression}, "enrollments": enrollments}


def funnel(conn: Connection, sequence_id: int) -> dict[str, Any]:
    """Per live step: entered (visits), sent (jobs sent), opened and clicked (messages
    with a tracked open or click; a click counts as an open), waiting there now, and how
    the sequence's enrollments ended (exits by reason)."""
    get_sequence(conn, sequence_id)
    rows = conn.execute(sa.text(f"""
        SELECT st.id, st.position, st.type, st.subject,
               (SELECT count(*) FROM sequence_visits v WHERE v.step_id = st.id) AS entered,
               (SELECT count(*) FROM sequence_visits v JOIN delivery_jobs j ON j.id = v.job_id
                 WHERE v.step_id = st.id AND j.status = '{SENT}') AS sent,
               (SELECT count(*) FROM sequence_visits v
                 WHERE v.step_id = st.id AND v.outcome = 'exited') AS exited,
               (SELECT count(DISTINCT x.job_id) FROM sequence_events x
                 WHERE x.step_id = st.id) AS opened,
               (SELECT count(DISTINCT x.job_id) FROM sequence_events x
                 WHERE x.step_id = st.id AND x.kind = 'click') AS clicked,
               (SELECT count(*) FROM sequence_enrollments e
                 WHERE e.step_id = st.id AND e.status IN {OPEN}) AS waiting
          FROM sequence_steps st WHERE st.sequence_id = :s AND st.removed_at IS NULL
         ORDER BY st.position, st.id"""), {"s": sequence_id})
    steps = [dict(r._mapping) for r in rows]
    totals: dict[Any, Any] = dict(conn.execute(sa.text("""
        SELECT coalesce(exit_reason, status) AS why, count(*) FROM sequence_enrollments
         WHERE sequence_id = :s GROUP BY 1"""), {"s": sequence_id}).all())
    return {"steps": steps, "enrollments": {str(k): int(v) for k, v in totals.items()}}
