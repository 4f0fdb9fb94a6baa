"""Transactional kinds as data (docs/design.md §21): define and edit them (API ``PUT /kinds/{name}``
and the *Transactional* page), preview them with sample data, send a test, and read what
the page shows per kind.

Guarantees kept here:

- a kind is stored only when its three templates compile in the sandbox *and* render with
  its sample ``data``/``event``; otherwise :class:`Invalid` names the field and the line
  (P9: a template error is shown when the kind is defined, not discovered mid-send);
- ``verification`` is built in: it can be edited but not renamed, deactivated or moved out
  of the critical class (P7 is a promise about it);
- every change bumps the kind's ``version`` and is written to the audit log in the same
  transaction, so workers render new messages with the new templates.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.composer import FIELD_NAMES
from webapp.domain.errors import Conflict, Invalid, NotFound
from webapp.domain.lists import check_email
from workers import queue
from workers.building import kinds as engine_kinds
from workers.building.kinds import CLASSES, KindSpec, message_context
from workers.building.message import RenderedMessage, TemplateError, compile_campaign
from workers.core import fastjson
from workers.core.i18n import N_, Text

MAX_TEMPLATE = 100_000  # characters per template
MAX_SCHEDULE = 10  # retry delays
MAX_DELAY = 7 * 86400  # one retry delay
MAX_COOLDOWN = 30 * 86400
MAX_WINDOW = 366 * 86400
MAX_DESCRIPTION = 500
MAX_SAMPLE_BYTES = 64 * 1024
# A new kind's defaults per class: critical mail retries fast and briefly, lifecycle mail
# patiently (a reminder an hour late is fine; one lost is not).
DEFAULTS: dict[str, dict[str, Any]] = {
    "critical": {"retry_schedule": [30, 120, 600], "resend_cooldown": 60, "dedupe_window": 0},
    "lifecycle": {"retry_schedule": [300, 1800, 7200, 21600], "resend_cooldown": 3600,
                  "dedupe_window": 86400},
}
SAMPLE_EVENT = {"name": "signup", "id": "evt_123", "at": "2026-12-01T09:00:00Z"}


def check_name(raw: Any) -> str:
    """A kind name: lower-case letters, digits, ``_`` and ``-``, starting with a letter,
    at most 40 characters, not a reserved engine kind; else :class:`Invalid`."""
    name = raw.strip() if isinstance(raw, str) else ""
    if not re.fullmatch(engine_kinds.NAME_PATTERN, name):
        problem = N_("1 to 40 lower-case letters, digits, '_' or '-', starting with a letter")
        raise Invalid(N_("kind name must be %(problem)s", problem=problem),
                      fields={"name": problem})
    if name in engine_kinds.RESERVED:
        raise Invalid(N_("%(name)s is reserved for SendDock's own mail", name=repr(name)),
                      fields={"name": N_("reserved")})
    return name


def known_names(conn: Connection, *, active_only: bool = True) -> list[str]:
    sql = "SELECT name FROM kinds" + (" WHERE active" if active_only else "") + \
          " ORDER BY builtin DESC, name"
    return list(conn.execute(sa.text(sql)).scalars())


def get(conn: Connection, name: str) -> KindSpec:
    """The kind, or :class:`NotFound` (404) listing the kinds that exist."""
    spec = engine_kinds.load_kind(conn, name)
    if spec is None:
        known = known_names(conn, active_only=False)
        raise NotFound(N_("there is no kind %(name)s; known kinds: %(known)s", name=repr(name),
                          known=", ".join(known)),
                       fields={"kind": N_("unknown; known kinds: %(known)s",
                                          known=", ".join(known))},
                       known_kinds=known)
    return spec


@dataclass(frozen=True)
class KindPolicy:
    """What a kind adds to the one request pipeline (:mod:`webapp.domain.intake`): the
    built-in verification kind has every rule, an admin's kind none of them (its class,
    retry schedule, cooldown and dedupe window are its own settings)."""

    one_live: bool = False  # one live job per user (delivery_jobs_one_active_idx)
    hold_disposable: bool = False  # held for support under SENDDOCK_DISPOSABLE_POLICY=hold
    verify_url: bool = False  # data.verify_url required (an http(s) URL)
    request_cooldown: bool = False  # no second email to one address inside the cooldown


VERIFICATION_POLICY = KindPolicy(one_live=True, hold_disposable=True, verify_url=True,
                                 request_cooldown=True)


def policy(spec: KindSpec) -> KindPolicy:
    return VERIFICATION_POLICY if spec.builtin else KindPolicy()


def cooldown_of(spec: KindSpec, config: Any) -> int:
    """The kind's resend cooldown: its own, else SENDDOCK_RESEND_COOLDOWN."""
    return config.resend_cooldown if spec.resend_cooldown is None else spec.resend_cooldown


# The kinds as the request pipeline last read them, per database. A stale entry costs one
# more statement, never a wrong answer: the pipeline's statement compares the fields it
# relies on with the row and answers ``stale`` when they differ.
_ACTIVE: dict[tuple[str, str], KindSpec] = {}


def active(conn: Connection, name: str, *, fresh: bool = False) -> KindSpec:
    """An active kind for a request: :class:`NotFound` listing the known ones, a 409 when
    it is inactive. Read from the database when not cached or ``fresh``."""
    key = (str(conn.engine.url.database), name)  # our engines' URLs name host and database
    spec = None if fresh else _ACTIVE.get(key)
    if spec is None:
        spec = get(conn, name)
        _ACTIVE[key] = spec
    if not spec.active:
        raise Conflict(N_("kind %(name)s is inactive; an admin can activate it on the "
                          "Transactional page", name=spec.name), fields={"kind": N_("inactive")})
    return spec


def sample_of(conn: Connection, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sample ``data`` and ``event`` stored with the kind (for preview and tests)."""
    row = conn.execute(sa.text("SELECT sample_data, sample_event FROM kinds WHERE name = :n"),
                       {"n": name}).first()
    return (dict(row.sample_data), dict(row.sample_event)) if row else ({}, {})


# --- input -------------------------------------------------------------------------------

def _seconds(field: str, raw: Any, most: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= most:
        problem = N_("a whole number of seconds from 0 to %(max)s", max=str(most))
        raise Invalid(N_("%(field)s must be %(problem)s", field=field, problem=problem),
                      fields={field: problem})
    return raw


def _schedule(raw: Any) -> list[int]:
    if not isinstance(raw, list) or len(raw) > MAX_SCHEDULE or any(
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DELAY
            for v in raw):
        problem = N_("a list of at most %(count)s delays in seconds (0 to %(max)s); [] means "
                     "never retry", count=str(MAX_SCHEDULE), max=str(MAX_DELAY))
        raise Invalid(N_("%(field)s must be %(problem)s", field="retry_schedule",
                         problem=problem), fields={"retry_schedule": problem})
    return list(raw)


def _template(field: str, raw: Any, required: bool) -> str | None:
    if raw is None or (isinstance(raw, str) and not raw.strip() and not required):
        if required:
            raise Invalid(N_("%(field)s is required", field=field),
                          fields={field: N_("required")})
        return None
    if not isinstance(raw, str) or len(raw) > MAX_TEMPLATE:
        problem = N_("a template of at most %(max)s characters", max=str(MAX_TEMPLATE))
        raise Invalid(N_("%(field)s must be %(problem)s", field=field, problem=problem),
                      fields={field: problem})
    if required and not raw.strip():
        raise Invalid(N_("%(field)s is required", field=field), fields={field: N_("required")})
    return raw


def check_object(field: str, raw: Any, *, limit: int = MAX_SAMPLE_BYTES) -> dict[str, Any]:
    """A JSON object of at most ``limit`` bytes (as compact JSON), else :class:`Invalid`
    (413 :class:`TooLarge` when it is only too big)."""
    from webapp.domain.errors import TooLarge

    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise Invalid(N_("%(field)s must be a JSON object", field=field),
                      fields={field: N_("must be an object")})
    quick = fastjson.size(raw)  # far under the limit: no need for the exact size
    if quick is not None and 2 * quick < limit:
        return raw
    size = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limit:
        problem = N_("at most %(kb)s KB as JSON (got %(size)s bytes)", kb=str(limit // 1024),
                     size=str(size))
        raise TooLarge(N_("%(field)s must be %(problem)s", field=field, problem=problem),
                       fields={field: problem})
    return raw


@dataclass
class KindInput:
    """A validated kind, ready to store."""

    name: str
    kind_class: str
    subject: str
    text_body: str | None
    html_body: str | None
    retry_schedule: list[int] | None
    resend_cooldown: int | None
    dedupe_window: int
    active: bool
    description: str
    sample_data: dict[str, Any]
    sample_event: dict[str, Any]
    # A class change: {field: {"from": old, "to": the new class's default}} for each timing
    # the new class's default replaced.
    class_changes: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


#: The fields a class gives defaults to.
TIMINGS = ("retry_schedule", "resend_cooldown", "dedupe_window")

_FIELDS = ("class", "subject", "text", "html", "retry_schedule", "resend_cooldown",
           "dedupe_window", "active", "description", "sample_data", "sample_event")


def _current(conn: Connection, name: str) -> dict[str, Any] | None:
    spec = engine_kinds.load_kind(conn, name)
    if spec is None:
        return None
    data, event = sample_of(conn, name)
    return {"class": spec.kind_class, "subject": spec.subject, "text": spec.text_body,
            "html": spec.html_body, "retry_schedule": None if spec.retry_schedule is None
            else list(spec.retry_schedule), "resend_cooldown": spec.resend_cooldown,
            "dedupe_window": spec.dedupe_window, "active": spec.active,
            "description": spec.description, "sample_data": data, "sample_event": event,
            "builtin": spec.builtin}


DEFAULT_CLASS = "lifecycle"


def _merged(name: str, body: dict[str, Any], current: dict[str, Any] | None) -> dict[str, Any]:
    """The body over the kind's current values (or the class defaults for a new kind)."""
    unknown = sorted(set(body) - set(_FIELDS) - {"name"})
    if unknown:
        raise Invalid(N_("unknown field(s): %(fields)s", fields=", ".join(unknown)),
                      fields=dict.fromkeys(unknown, N_("unknown field")))
    if current is None:
        # A new kind is lifecycle mail unless it says otherwise (the document's default).
        kind_class = body.get("class", DEFAULT_CLASS)
        if kind_class not in CLASSES:
            problem = N_("required: critical or lifecycle")
            raise Invalid(N_("class is %(problem)s", problem=problem), fields={"class": problem})
        base: dict[str, Any] = {**DEFAULTS[kind_class], "class": kind_class, "active": True,
                                "description": "",
                                "sample_data": {}, "sample_event": SAMPLE_EVENT,
                                "text": None, "html": None, "builtin": False}
    else:
        base = current
    merged = {**base, **body}
    merged["_class_changes"] = _class_defaults(body, current, merged)
    if not (current and current["builtin"]) and merged["class"] in CLASSES:
        for field in ("retry_schedule", "resend_cooldown"):  # null: the class's default
            if merged.get(field) is None:
                merged[field] = DEFAULTS[merged["class"]][field]
    if current is not None and current["builtin"]:
        if merged["class"] != "critical" or merged["active"] is not True:
            # 409, not 422: the body is well formed; it conflicts with what this kind is.
            raise Conflict(N_("%(name)s is built in: it stays active and critical (P7)",
                             name=name),
                          fields={"class" if merged["class"] != "critical" else "active":
                                  N_("cannot change for the built-in kind")})
    return merged


def _class_defaults(body: dict[str, Any], current: dict[str, Any] | None,
                    merged: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A kind moving to another class takes that class's timings (a kind switched from
    lifecycle to critical must not keep retrying for six hours): each timing the body
    leaves out, leaves empty or repeats unchanged (a form or a GET-edit-PUT sends the
    stored value back) becomes the new class's default, in ``merged``. A timing given a
    new value wins. Returns what changed: {field: {"from": …, "to": …}}."""
    if current is None or current["builtin"] or merged.get("class") not in CLASSES \
            or merged["class"] == current["class"]:
        return {}
    changes: dict[str, dict[str, Any]] = {}
    for name in TIMINGS:
        if name in body and body[name] is not None and body[name] != current[name]:
            continue
        default = DEFAULTS[merged["class"]][name]
        merged[name] = default
        if current[name] != default:
            changes[name] = {"from": current[name], "to": default}
    return changes


def parse_kind(conn: Connection, name: str, body: dict[str, Any]) -> tuple[KindInput, bool]:
    """Validate a ``PUT /kinds/{name}`` body; fields left out keep their current value (a
    new kind's: its class's defaults). Returns (kind, created). Raises :class:`Invalid`
    naming every offending field (templates: with the line)."""
    name = check_name(name)
    if "name" in body and body["name"] != name:
        raise Invalid(N_("the name in the body differs from the one in the URL"),
                      fields={"name": N_("differs from the URL")})
    current = _current(conn, name)
    merged = _merged(name, body, current)
    class_changes = merged.pop("_class_changes")
    fields: dict[str, str] = {}
    values: dict[str, Any] = {}
    builtin = bool(current and current["builtin"])
    checks = {
        "class": lambda v: v if v in CLASSES else _bad("class", N_("critical or lifecycle")),
        "subject": lambda v: _template("subject", v, required=True),
        "text": lambda v: _template("text", v, required=False),
        "html": lambda v: _template("html", v, required=False),
        "retry_schedule": lambda v: None if v is None and builtin else _schedule(v),
        "resend_cooldown": lambda v: None if v is None and builtin
        else _seconds("resend_cooldown", v, MAX_COOLDOWN),
        "dedupe_window": lambda v: _seconds("dedupe_window", v, MAX_WINDOW),
        "active": lambda v: v if isinstance(v, bool) else _bad("active", N_("true or false")),
        "description": lambda v: v if isinstance(v, str) and len(v) <= MAX_DESCRIPTION
        else _bad("description", N_("text of at most %(max)s characters",
                                    max=str(MAX_DESCRIPTION))),
        "sample_data": lambda v: check_object("sample_data", v),
        "sample_event": lambda v: check_object("sample_event", v),
    }
    for field, check in checks.items():
        try:
            values[field] = check(merged.get(field))
        except Invalid as exc:
            fields.update(exc.fields or {field: exc.message})
    if current is None and body.get("subject") is None and "subject" in fields:
        # A new kind given no subject: like a missing template, a conflict with what is
        # stored (nothing yet), which no schema of the request can see: 409.
        raise Conflict(N_("%(field)s is required", field="subject"),
                       fields={"subject": N_("required")})
    if not fields and values["text"] is None and values["html"] is None:
        # 409, not 422: whether a body is left depends on the kind as stored (fields left
        # out keep their value), which no schema of the request can see.
        problem = N_("give a text or an HTML template (or both)")
        raise Conflict(N_("invalid kind: %(problems)s", problems=Text.joined("; ", (
            N_("%(field)s: %(message)s", field="text", message=problem),))),
            fields={"text": problem})
    if fields:
        raise Invalid(N_("invalid kind: %(problems)s", problems=Text.joined("; ", (
            N_("%(field)s: %(message)s", field=k, message=v) for k, v in fields.items()))),
                      fields=fields)
    kind = KindInput(name, values["class"], values["subject"], values["text"], values["html"],
                     values["retry_schedule"], values["resend_cooldown"],
                     values["dedupe_window"], values["active"], values["description"],
                     values["sample_data"], values["sample_event"], class_changes)
    render(kind, kind.sample_data, kind.sample_event)  # refuses what cannot render
    return kind, current is None


def _bad(field: str, problem: str) -> Any:
    raise Invalid(N_("%(field)s must be %(problem)s", field=field, problem=problem),
                  fields={field: problem})


def template_problem(exc: TemplateError) -> Invalid:
    """A template error as P9 wants it: the field, and the line when known."""
    field = FIELD_NAMES.get(exc.field, exc.field)
    if exc.line is None:
        return Invalid(N_("the %(field)s template has an error: %(message)s", field=field,
                          message=exc.message), fields={exc.field: exc.message})
    return Invalid(N_("the %(field)s template has an error: line %(line)s: %(message)s",
                      field=field, line=str(exc.line), message=exc.message),
                   fields={exc.field: N_("line %(line)s: %(message)s", line=str(exc.line),
                                         message=exc.message)}, line=exc.line)


def render(kind: KindInput | KindSpec, data: dict[str, Any], event: dict[str, Any],
           email: str = "ada@example.com", user_ref: str = "user-123") -> RenderedMessage:
    """Render the kind as a worker would for this ``data``/``event`` (the same context);
    :class:`Invalid` naming the template and line when it cannot."""
    try:
        template = compile_campaign(kind.subject, kind.text_body, kind.html_body)
        return template.render(message_context(email=email, user_ref=user_ref,
                                               kind=kind.name,
                                               payload={"data": data, "event": event}))
    except TemplateError as exc:
        raise template_problem(exc) from None


# --- store -------------------------------------------------------------------------------

_UPSERT = sa.text("""
INSERT INTO kinds AS k (name, class, subject, text_body, html_body, retry_schedule,
                        resend_cooldown, dedupe_window, active, description, sample_data,
                        sample_event, updated_by)
VALUES (:name, :class, :subject, :text_body, :html_body, CAST(:retry_schedule AS int[]),
        :resend_cooldown, :dedupe_window, :active, :description, CAST(:sample_data AS jsonb),
        CAST(:sample_event AS jsonb), :actor)
ON CONFLICT (name) DO UPDATE SET
    class = EXCLUDED.class, subject = EXCLUDED.subject, text_body = EXCLUDED.text_body,
    html_body = EXCLUDED.html_body, retry_schedule = EXCLUDED.retry_schedule,
    resend_cooldown = EXCLUDED.resend_cooldown, dedupe_window = EXCLUDED.dedupe_window,
    active = EXCLUDED.active, description = EXCLUDED.description,
    sample_data = EXCLUDED.sample_data, sample_event = EXCLUDED.sample_event,
    updated_by = EXCLUDED.updated_by, updated_at = now(), version = k.version + 1
RETURNING version
""")


def save(conn: Connection, kind: KindInput, *, actor: str, created: bool) -> dict[str, Any]:
    """Store the validated kind (a new version), audit it, and return it as JSON."""
    version = conn.execute(_UPSERT, {
        "name": kind.name, "class": kind.kind_class, "subject": kind.subject,
        "text_body": kind.text_body, "html_body": kind.html_body,
        "retry_schedule": kind.retry_schedule, "resend_cooldown": kind.resend_cooldown,
        "dedupe_window": kind.dedupe_window, "active": kind.active,
        "description": kind.description, "sample_data": json.dumps(kind.sample_data),
        "sample_event": json.dumps(kind.sample_event), "actor": actor}).scalar_one()
    audit.record(conn, actor, "kind.create" if created else "kind.update",
                 f"kind:{kind.name}", version=version, kind_class=kind.kind_class,
                 active=kind.active, dedupe_window=kind.dedupe_window,
                 retry_schedule=kind.retry_schedule, resend_cooldown=kind.resend_cooldown)
    return as_json(conn, get(conn, kind.name))


def as_json(conn: Connection, spec: KindSpec) -> dict[str, Any]:
    """The API's view of a kind (``null`` schedule/cooldown: the setting's default)."""
    data, event = sample_of(conn, spec.name)
    return {"name": spec.name, "class": spec.kind_class, "description": spec.description,
            "subject": spec.subject, "text": spec.text_body, "html": spec.html_body,
            "retry_schedule": None if spec.retry_schedule is None
            else list(spec.retry_schedule),
            "resend_cooldown": spec.resend_cooldown, "dedupe_window": spec.dedupe_window,
            "active": spec.active, "builtin": spec.builtin, "version": spec.version,
            "priority": spec.priority, "sample_data": data, "sample_event": event}


def all_as_json(conn: Connection) -> list[dict[str, Any]]:
    return [as_json(conn, spec) for spec in engine_kinds.all_kinds(conn)]


# --- test send ---------------------------------------------------------------------------

def test_send(conn: Connection, name: str, email: Any, data: dict[str, Any],
              event: dict[str, Any], *, actor: str) -> int:
    """Queue one ``[Test]`` message of the kind to ``email``, rendered with ``data`` and
    ``event``. It is a ``test`` job (served first), so it never counts as the kind's mail
    in the metrics, the dedupe window or the user's history."""
    spec = get(conn, name)
    address = check_email(email)
    render(spec, data, event, email=address)
    job_id = queue.enqueue_test(conn, address, {"kind": spec.name,
                                                  "kind_version": spec.version,
                                                  "data": data, "event": event}, actor=actor)
    audit.record(conn, actor, "kind.test_send", f"kind:{spec.name}", job_id=job_id,
                 email=address)
    return job_id
