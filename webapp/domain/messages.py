"""Messages of any transactional kind (docs/design.md §21): ``POST /messages``, ``DELETE
/messages``, resend per kind, and what support reads per user. Verification mail keeps its own
module (:mod:`webapp.domain.verifications`, docs/design.md §21), which this one reuses.

Guarantees kept here:

- one message per user, kind and dedupe window, an ``Idempotency-Key`` returning its
  message whatever its state, and the verification kind's rules: all kept in the database
  by the one request pipeline (:mod:`webapp.domain.intake`) that ``POST /messages``,
  ``POST /messages/batch`` and ``POST /verifications`` share;
- ``send_at`` in the past (or now) sends at once, a later one schedules; a time must be
  before the year 3000 (:data:`SEND_AT_PATTERN`, which the OpenAPI document publishes);
  ``data`` and ``event`` are JSON objects of at most 64 KB each (P9, naming the field);
- the event is stored with the job (``payload.event``) and shown to support as it came;
- cancelling ends only what is still waiting, and says how many it ended.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Connection

from webapp.domain import audit, flags, intake, kinds, limits, queue_reads, verifications
from webapp.domain.errors import Conflict, DomainError, Invalid, NotFound, TooLarge, TooMany
from webapp.domain.lists import check_email
from workers import queue
from workers.building.kinds import BUILTIN, KindSpec
from workers.core.i18n import N_, word
from workers.core.settings import Config
from workers.core.states import PENDING, RETRY, SENDING

MAX_JSON_BYTES = 64 * 1024
# The latest send_at: before the year 3000, said as a pattern on the ISO 8601 text so that
# the OpenAPI document can publish the same rule (year 0000 is not a Python date).
LATEST_YEAR = 2999
SEND_AT_PATTERN = "^(?!0000)[0-2][0-9]{3}-"
MAX_EVENT_NAME = 200


# --- input -------------------------------------------------------------------------------

def check_send_at(raw: Any, now: datetime) -> datetime | None:
    """An ISO 8601 time with a zone before the year 3000 (None: now). A time in the past
    means now, as for a campaign's scheduled send: a client whose clock is behind, or a
    retry of an old request, sends at once instead of failing."""
    if raw is None:
        return None
    try:
        at = datetime.fromisoformat(raw.replace("Z", "+00:00")) if isinstance(raw, str) \
            else None
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        problem = "an ISO 8601 time with a zone, e.g. 2026-12-04T09:00:00Z"
        raise Invalid(f"send_at must be {problem}", fields={"send_at": problem})
    if at.year > LATEST_YEAR:
        problem = f"before the year {LATEST_YEAR + 1}"
        raise Invalid(f"send_at must be {problem}", fields={"send_at": problem})
    return None if at <= now else at.astimezone(UTC)


def check_event(raw: Any) -> dict[str, Any] | None:
    """The event that caused the message: an object with a ``name`` (and usually ``id``,
    ``at`` and fields of its own), at most 64 KB."""
    if raw is None:
        return None
    event = kinds.check_object("event", raw, limit=MAX_JSON_BYTES)
    name = event.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_EVENT_NAME:
        problem = f"needs a name (text of 1 to {MAX_EVENT_NAME} characters)"
        raise Invalid(f"event {problem}", fields={"event.name": problem})
    if "id" in event and (isinstance(event["id"], bool)
                          or not isinstance(event["id"], str | int)):
        raise Invalid("event.id must be a string or an integer",
                      fields={"event.id": "must be a string or an integer"})
    if "at" in event:
        try:
            datetime.fromisoformat(str(event["at"]).replace("Z", "+00:00"))
        except ValueError:
            raise Invalid("event.at must be an ISO 8601 time",
                          fields={"event.at": "must be an ISO 8601 time"}) from None
    return event


def parse_request(conn: Connection, body: dict[str, Any], *, key: str | None = None,
                  specs: dict[str, KindSpec] | None = None) -> intake.Ask:
    """Validate a ``POST /messages`` body (``key``: its idempotency key, already checked).
    An unknown kind is a 404 listing the known ones; an inactive one a 409; every other
    bad field is named in one :class:`Invalid` (413 when the only problem is the size of
    ``data``/``event``). ``specs`` keeps the kinds read for one call (a batch)."""
    name = body.get("kind")
    if not isinstance(name, str) or not name.strip():
        raise Invalid("kind is required", fields={"kind": "required"})
    name = name.strip()
    spec = specs.get(name) if specs is not None else None
    if spec is None:
        spec = kinds.active(conn, name)
        if specs is not None:
            specs[name] = spec
    now = datetime.now(UTC)
    fields: dict[str, str] = {}
    errors: list[TooLarge] = []
    values: dict[str, Any] = {}
    checks: dict[str, Any] = {
        "user_id": verifications.check_user_id, "email": check_email,
        "data": lambda v: kinds.check_object("data", v, limit=MAX_JSON_BYTES),
        "event": check_event, "send_at": lambda v: check_send_at(v, now)}
    for field_name, check in checks.items():
        try:
            values[field_name] = check(body.get(field_name))
        except Invalid as exc:
            fields.update(exc.fields or {field_name: exc.message})
        except TooLarge as exc:  # answered 413 when nothing else is wrong
            errors.append(exc)
    if kinds.policy(spec).verify_url and not fields and not errors:
        try:
            values["data"]["verify_url"] = verifications.check_verify_url(
                values["data"].get("verify_url"))
        except Invalid:
            fields["data.verify_url"] = "required for verification mail: an http(s) URL"
    unknown = sorted(set(body) - {"kind", *checks})
    fields.update(dict.fromkeys(unknown, "unknown field"))
    if fields:
        raise Invalid("invalid message: " + "; ".join(f"{k}: {v}" for k, v in fields.items()),
                      fields=fields)
    if errors:
        raise errors[0]
    return intake.Ask(spec, values["user_id"], values["email"], values["data"],
                      values["event"], values["send_at"], key)


# --- request -----------------------------------------------------------------------------

def request(conn: Connection, config: Config, req: intake.Ask, *,
            idempotency_key: str | None = None, actor: str) -> tuple[dict[str, Any], str]:
    """Enqueue the message, or return the one that already answers it (the one pipeline,
    :mod:`webapp.domain.intake`). Returns (job, why_existing) where why_existing is "" for
    a new message, else ``idempotency_key``, ``dedupe_window`` or ``live``. Raises what
    refused it (409 key reused or address in flight, 429 cooldown, 503 backlog)."""
    ask = req if idempotency_key is None else dataclasses.replace(req, key=idempotency_key)
    answer = intake.submit(conn, config, [ask], actor=actor)[0]
    if answer.error is not None:
        raise answer.error
    assert answer.job is not None
    return answer.job, answer.why


MAX_BATCH = 500


def parse_batch(conn: Connection, body: Any) -> tuple[list[intake.Ask | None],
                                                       dict[int, DomainError]]:
    """Validate a ``POST /messages/batch`` body: ``{"messages": [...]}`` of 1 to
    :data:`MAX_BATCH` items, each a ``POST /messages`` body plus an optional
    ``idempotency_key``. A bad item is an error at its index (naming its fields), never a
    refusal of the others; only a malformed envelope (not a list of 1 to 500 objects)
    refuses the whole call."""
    items = body.get("messages")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        problem = f"a list of 1 to {MAX_BATCH} messages"
        raise Invalid(f"messages must be {problem}", fields={"messages": problem})
    odd = [i for i, item in enumerate(items) if not isinstance(item, dict)]
    if odd:
        raise Invalid("each message must be a JSON object", fields={
            f"messages[{i}]": "must be a JSON object" for i in odd})
    asks: list[intake.Ask | None] = []
    errors: dict[int, DomainError] = {}
    specs: dict[str, KindSpec] = {}  # each kind read once per call
    for index, item in enumerate(items):
        try:
            key = None
            if "idempotency_key" in item:
                item = dict(item)
                key = item.pop("idempotency_key")
                if key is not None and not isinstance(key, str):
                    raise Invalid("idempotency_key must be a string",
                                  fields={"idempotency_key": "must be a string"})
                key = verifications.check_idempotency_key(key, field="idempotency_key")
            asks.append(parse_request(conn, item, key=key, specs=specs))
        except DomainError as exc:
            asks.append(None)
            errors[index] = exc
    return asks, errors


def batch(conn: Connection, config: Config, asks: list[intake.Ask | None],
          errors: dict[int, DomainError], *, actor: str) -> list[dict[str, Any]]:
    """Submit the valid asks in one statement; one result per item, in order: ``202`` with
    the message (``existing``/``existing_because`` as for one), or the item's error with
    its status, message and fields."""
    valid = [(i, a) for i, a in enumerate(asks) if a is not None]
    answers = dict(zip([i for i, _ in valid],
                       intake.submit(conn, config, [a for _, a in valid], actor=actor,
                                     bulk=True),
                       strict=True))
    results = []
    for index in range(len(asks)):
        error = errors.get(index)
        answer = answers.get(index)
        if error is None and answer is not None:
            error = answer.error
        if error is not None:
            results.append({"index": index, "http_status": error.status,
                            "error": {"message": str(error.message), "fields": {
                                k: str(v) for k, v in error.fields.items()}}})
        else:
            assert answer is not None and answer.job is not None
            results.append({"index": index, "http_status": 202, **as_json(answer.job),
                            "existing": bool(answer.why),
                            "existing_because": answer.why or None})
    return results


def as_json(job: dict[str, Any]) -> dict[str, Any]:
    """The API's view of a message: what was asked, and what caused it."""
    payload = job.get("payload") or {}
    data = payload.get("data")
    if data is None and "verify_url" in payload:
        data = {"verify_url": payload["verify_url"]}
    return {"id": job["id"], "status": job["status"], "kind": job["kind"],
            "correlation_id": job["correlation_id"], "flags": job["flags"],
            "email": job["email"], "user_id": job["user_ref"],
            "created_at": job["created_at"], "send_at": payload.get("send_at"),
            "data": data or {}, "event": payload.get("event")}


# --- cancel ------------------------------------------------------------------------------

def cancel(conn: Connection, kind_name: Any, user_ref: Any, *, actor: str) -> dict[str, Any]:
    """Cancel every message of the kind still waiting for the user (the user did the
    thing): ``{"cancelled": n, "ids": [...], "in_flight": m}``; messages being handed to
    the relay at this instant cannot be called back and are counted in ``in_flight``."""
    fields = {}
    if not isinstance(kind_name, str) or not kind_name.strip():
        fields["kind"] = "required"
    try:
        user = verifications.check_user_id(user_ref)
    except Invalid as exc:
        fields.update(exc.fields)
    if fields:
        raise Invalid("DELETE /messages needs kind and user_id: " + ", ".join(fields),
                      fields=fields)
    spec = kinds.get(conn, str(kind_name).strip())
    queue.lock_user(conn, spec.name, user)
    ids = queue.cancel_waiting(conn, spec.name, user, f"cancelled by {actor}")
    in_flight = queue.in_flight_for_user(conn, spec.name, user)
    if ids:
        audit.record(conn, actor, "message.cancel", f"user:{user}", kind=spec.name,
                     job_ids=ids, cancelled=len(ids))
    return {"kind": spec.name, "user_id": user, "cancelled": len(ids), "ids": ids,
            "in_flight": in_flight}


# --- resend ------------------------------------------------------------------------------

def resend(conn: Connection, config: Config, kind_name: str, user_ref: str, *,
           actor: str) -> tuple[dict[str, Any], bool]:
    """Send the user's latest message of the kind again (verification: exactly as docs/design.md
    §21). A waiting one is made due now instead of adding a row; otherwise a copy with the same
    data and event is queued. :class:`TooMany` inside the kind's cooldown."""
    spec = kinds.get(conn, kind_name)
    if kinds.policy(spec).one_live:  # one live job per user: docs/design.md §21's resend rules
        return verifications.resend(conn, config, user_ref, actor=actor)
    queue.lock_user(conn, spec.name, user_ref)
    cooldown = kinds.cooldown_of(spec, config)
    latest = queue.latest_job_for_user(conn, spec.name, user_ref, cooldown)
    if latest is None:
        raise NotFound(N_("no %(kind)s email was ever requested for user %(user)s",
                          kind=word(spec.name), user=user_ref),
                       fields={"user_id": N_("unknown user")})
    suppression = flags.suppression(conn, latest["email"])
    if suppression is not None:
        raise Conflict(N_("%(email)s is on the suppression list (%(reason)s); an admin must "
                          "remove it first", email=latest["email"],
                          reason=word(suppression["reason"])),
                       fields={"user_id": N_("address suppressed")}, job_id=latest["id"])
    left = float(latest["cooldown_left"])
    if left > 0:
        wait = math.ceil(left)
        raise TooMany(N_("an email of kind %(kind)s was sent to this user moments ago; you "
                         "can resend in %(seconds)s s", kind=word(spec.name),
                         seconds=str(wait)), retry_after=wait,
                      retry_at=latest["cooldown_until"].isoformat(), job_id=latest["id"])
    if latest["status"] in (PENDING, SENDING, RETRY):
        job = queue.mark_resent(conn, latest["id"], spec.priority)
        assert job is not None
        reused = True
    else:
        limits.check_backlog(conn, config)
        payload = {k: v for k, v in (latest["payload"] or {}).items()
                   if k not in ("resent_at", "resends", "send_at")}
        payload["kind_version"] = spec.version
        job = intake.resend(conn, config, spec, user_ref, latest["email"], payload,
                            actor=actor)
        reused = False
    if reused:
        queue.notify_new_jobs(conn, spec.name)
    audit.record(conn, actor, "message.resend", f"user:{user_ref}", kind=spec.name,
                 job_id=job["id"], reused=reused, previous_job_id=latest["id"])
    return job, reused


# --- support: every kind for one user ----------------------------------------------------

@dataclass
class KindHistory:
    """One kind's messages for one user, as support sees them."""

    spec: KindSpec
    history: verifications.UserHistory
    cooldown: int
    max_attempts: int
    events: dict[int, dict[str, Any]] = field(default_factory=dict)


def user_overview(conn: Connection, config: Config, user_ref: str) -> list[KindHistory]:
    """Every kind the user has mail of (the built-in first), each with its messages, the
    event that caused each one, and its own resend cooldown; :class:`NotFound` when the
    user has none."""
    sections = []
    for spec in [kinds.get(conn, name) for name in queue_reads.kinds_for_user(conn, user_ref)]:
        cooldown = kinds.cooldown_of(spec, config)
        schedule = spec.retry_schedule if spec.retry_schedule is not None \
            else config.retry_schedule.get(spec.name, config.retry_schedule[BUILTIN])
        history = verifications.user_history(conn, config, user_ref, kind=spec.name,
                                             cooldown=cooldown,
                                             max_attempts=len(schedule) + 1)
        events = {v.job["id"]: (v.job["payload"] or {}).get("event") or {}
                  for v in history.jobs}
        sections.append(KindHistory(spec, history, cooldown, len(schedule) + 1, events))
    if not sections:
        raise NotFound(N_("no emails for user %(user)s", user=user_ref))
    sections.sort(key=lambda s: (not s.spec.builtin, s.spec.name))
    return sections
