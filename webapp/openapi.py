"""The OpenAPI document served at ``/api/v1/openapi.json``: every endpoint with its shapes."""

from __future__ import annotations

from typing import Any

from webapp.domain import (
    deliverability,
    layouts,
    lists,
    messages,
    segments,
    sequences,
    subscriptions,
    suppressions,
    text_limits,
    tracking,
    verifications,
    warmups,
)
from webapp.domain import fields as rules
from webapp.domain import kinds as kinds_input
from webapp.models import SUPPRESSION_REASONS
from workers.after_acceptance import bounce_rules
from workers.after_acceptance.bounces import VOCABULARY
from workers.building import kinds
from workers.building.message import (
    CONTENT_PLACEHOLDER,
    MAX_TEMPLATE_CHARS,
    UNSUBSCRIBE_PLACEHOLDER,
)
from workers.core import states
from workers.delivery import warmup
from workers.queue import audience

BIGINT_MAX = 2**63 - 1

ERROR = {"$ref": "#/components/schemas/Error"}
COUNTS = {"type": "object", "properties": {s: {"type": "integer"} for s in states.COUNTED}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": "error", **_json(ERROR)} for c in codes}


def _op(summary: str, ok: int, schema: dict[str, Any], *errors: int,
        request: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary,
                          "responses": {str(ok): {"description": "ok", **_json(schema)},
                                        **_errors(401, 403, *errors)}}
    if request is not None:
        op["requestBody"] = {"required": True, **_json(request)}
    return op


def _also(op: dict[str, Any], status: int, description: str,
          schema: dict[str, Any]) -> dict[str, Any]:
    """``op`` with one more successful answer."""
    return {**op, "responses": {**op["responses"],
                                str(status): {"description": description, **_json(schema)}}}


CAMPAIGN = {"$ref": "#/components/schemas/Campaign"}
JOB = {"$ref": "#/components/schemas/Job"}
SUPPRESSION: dict[str, Any] = {"type": "object", "required": ["email", "reason"], "properties": {
    "email": {"type": "string"}, "reason": {"type": "string"},
    "job_id": {"type": ["integer", "null"]}, "reply": {"type": ["string", "null"]},
    "note": {"type": "string"}, "created_by": {"type": ["string", "null"]},
    "created_at": {"type": "string", "format": "date-time"}}}
SUPPRESSION_ADDED = {**SUPPRESSION, "required": ["email", "reason", "created"], "properties": {
    **SUPPRESSION["properties"], "created": {"type": "boolean"}}}
# Ids are PostgreSQL bigints; Flask's int converter takes no sign.
ID_SCHEMA = {"type": "integer", "minimum": 0, "maximum": BIGINT_MAX}
ID_PARAM = [{"name": "id", "in": "path", "required": True, "schema": ID_SCHEMA}]
VERIFICATION = {"type": "object", "required": ["id", "status", "correlation_id", "flags"],
                "properties": {"id": {"type": "integer"}, "status": {"type": "string"},
                               "correlation_id": {"type": "string"},
                               "flags": {"type": "array", "items": {"type": "string"}},
                               "email": {"type": "string"}, "user_id": {"type": "string"},
                               "created_at": {"type": "string"},
                               "existing": {"type": "boolean"}, "reused": {"type": "boolean"}}}

# Any JSON value PostgreSQL can store (no NUL in any text, keys included).
STORABLE_REF = "#/components/schemas/Storable"
STORABLE = {"anyOf": [
    {"type": "string", "pattern": rules.NO_NUL}, {"type": ["number", "boolean", "null"]},
    {"type": "array", "items": {"$ref": STORABLE_REF}},
    {"type": "object", "propertyNames": {"pattern": rules.NO_NUL},
     "additionalProperties": {"$ref": STORABLE_REF}}]}

# Request fields, each as strict as the server's own check (webapp.domain.fields).
TEXT = {"type": "string", "pattern": rules.NO_NUL}
NOTE = {**TEXT, "maxLength": text_limits.SUPPRESSION_NOTE}
EMAIL = {"type": "string", "format": "email", "maxLength": 254, "pattern": rules.EMAIL}
USER_ID = {"oneOf": [
    {"type": "string", "maxLength": verifications.MAX_USER_ID,
     "pattern": rules.PLAIN_NOT_BLANK},
    {"type": "integer", "minimum": verifications.MIN_INT_USER_ID,
     "maximum": verifications.MAX_INT_USER_ID}],
    "description": "the SaaS's user id: text without control characters, or an integer"}
VERIFY_URL = {"type": "string", "maxLength": verifications.MAX_URL, "pattern": rules.HTTP_URL,
              "description": "an absolute http:// or https:// URL"}
# A campaign's From: left out, null or blank for SENDDOCK_FROM, an address, or
# "Name <address>" — no control character anywhere (it becomes a mail header).
FROM = {"anyOf": [
    {"type": "null"}, {"type": "string", "pattern": "^[ ]*$"}, EMAIL,
    {"type": "string", "pattern": rules.NAMED_ADDRESS, "maxLength": text_limits.FROM}],
    "description": "an address or Name <address> (blank or null: SENDDOCK_FROM); no CR, LF "
                   "or other control character"}
SUBSCRIBER = {"type": "object", "required": ["email"], "additionalProperties": False,
              "properties": {
                  "email": EMAIL,
                  "name": {"type": ["string", "null"], "maxLength": lists.MAX_NAME,
                           "pattern": rules.NO_NUL},
                  "attributes": {"type": ["object", "null"],
                                 "propertyNames": {"pattern": rules.NO_NUL, "maxLength":
                                                   text_limits.ATTRIBUTE_NAME},
                                 "additionalProperties": {"$ref": STORABLE_REF}},
                  "tracking": {"type": ["boolean", "null"], "description": (
                      "consent to open and click tracking (absent or null: as stored; a "
                      "new subscriber allows it)")}}}


def _request(required: list[str], properties: dict[str, Any], **more: Any
             ) -> dict[str, Any]:
    """A request body object: unknown fields are refused (422 naming them)."""
    return {"type": "object", "required": required, "properties": properties,
            "additionalProperties": False, **more}


def _links(**targets: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """OpenAPI links from an answer to the operations that take what it returns."""
    return {name: {"operationId": op, **spec} for name, (op, spec) in targets.items()}


def _with_links(op: dict[str, Any], status: int, links: dict[str, Any]) -> dict[str, Any]:
    op["responses"][str(status)]["links"] = links
    return op


def _id(op_id: str, op: dict[str, Any]) -> dict[str, Any]:
    return {"operationId": op_id, **op}


BY_ID = {"parameters": {"id": "$response.body#/id"}}

PATHS: dict[str, Any] = {
    "/lists": {
        "get": _id("listLists", _op("All lists", 200, {
            "type": "object", "required": ["lists"],
            "properties": {"lists": {"type": "array"}}})),
        "post": _id("createList", _with_links(_op(
            "Create a list (a name used by another list, in any case, is 409)", 201,
            {"type": "object", "required": ["id", "name"],
             "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}},
            400, 409, 413, 422, request=_request(["name"], {"name": {
                "type": "string", "maxLength": lists.MAX_NAME, "pattern": rules.NOT_BLANK}})),
            201, _links(AddSubscribers=("addSubscribers", BY_ID),
                        CreateCampaign=("createCampaign", {
                            "requestBody": {"name": "Linked", "subject": "Hello",
                                            "text": "Hi {{ name }}",
                                            "list_id": "$response.body#/id"}})))),
    },
    "/lists/{id}/subscribers": {
        "parameters": ID_PARAM,
        "post": _id("addSubscribers", _op(
            "Add or update subscribers (each one is checked on its own: an invalid one is "
            "reported in errors with its index, the rest are saved)", 200, {
                "type": "object", "required": ["added", "updated", "errors"],
                "properties": {"added": {"type": "integer"}, "updated": {"type": "integer"},
                               "errors": {"type": "array"}}}, 400, 404, 413, 422,
            request=_request(["subscribers"], {"subscribers": {
                "type": "array", "maxItems": 10_000,
                # Any item is accepted and reported on by itself (P9), so the item schema
                # says what a useful one looks like without refusing the others.
                "items": {"anyOf": [SUBSCRIBER, {"$ref": STORABLE_REF}]}}}))),
    },
    "/lists/{id}/subscribe": {
        "parameters": ID_PARAM,
        "post": _id("subscribe", {
            **_op("Ask for a subscription to the list (double opt-in, public: no token). The "
                  "list's subscription form must be on. A confirmation email is sent; the "
                  "address joins the list when its link is confirmed. The answer is the "
                  "same whether or not the address is already on the list. At most "
                  f"{subscriptions.RATE_PER_HOUR} requests per IP address per hour (429).",
                  202, {"type": "object", "required": ["status", "message"],
                        "properties": {"status": {"const": "pending"},
                                       "message": {"type": "string"}}},
                  400, 404, 409, 413, 422, 429,
                  request=_request(["email"], {
                      "email": EMAIL,
                      "name": {"type": "string", "maxLength": lists.MAX_NAME,
                               "pattern": rules.NO_NUL},
                      "locale": {"type": "string", "enum": list(subscriptions.LOCALES),
                                 "description": "the confirmation email's language"}})),
            "security": []}),
    },
    "/campaigns": {
        "post": _id("createCampaign", _with_links(_op(
            "Create a campaign (draft). Its templates are compiled at once: one the "
            "sandbox refuses is 422 naming the field; a segment of another list is 409",
            201, CAMPAIGN, 400, 404, 409, 413, 422,
            request=_request(["name", "list_id", "subject"], {
                "name": {"type": "string", "pattern": rules.NOT_BLANK,
                         "maxLength": text_limits.CAMPAIGN_NAME},
                "list_id": {"type": "integer", "minimum": -BIGINT_MAX - 1,
                            "maximum": BIGINT_MAX},
                "subject": {"type": "string", "pattern": rules.PLAIN_NOT_BLANK,
                            "maxLength": text_limits.SUBJECT,
                            "description": "a template; no CR, LF or other control "
                                           "character (it becomes a mail header)"},
                "text": {"type": ["string", "null"], "pattern": rules.NO_NUL},
                "html": {"type": ["string", "null"], "pattern": rules.NO_NUL},
                "from": FROM,
                **{k: {"type": "boolean", "description": d} for k, d in (
                    ("track_opens", "count opens with an image (default false)"),
                    ("track_clicks", "count clicks through signed links (default false)"),
                    ("archive", "publish a web version once sent (default false)"))}},
                anyOf=[
                # A text or an HTML body, at least one of them not blank.
                {"required": [body], "properties": {body: {
                    "type": "string", "pattern": rules.NOT_BLANK}}} for body in ("text",
                                                                              "html")])),
            201, _links(GetCampaign=("getCampaign", BY_ID),
                        **{f"{a.capitalize()}Campaign": (f"{a}Campaign", BY_ID)
                           for a in ("send", "pause", "resume", "cancel")}))),
    },
    "/campaigns/{id}": {"parameters": ID_PARAM,
                        "get": _id("getCampaign", _op("A campaign with exact counts", 200,
                                                      CAMPAIGN, 400, 404))},
    **{f"/campaigns/{{id}}/{action}": {
        "parameters": ID_PARAM,
        "post": _id(f"{action}Campaign", _op(f"{action.capitalize()} the campaign", 202,
                                             CAMPAIGN, 400, 404, 409, 422))}
       for action in ("send", "pause", "resume", "cancel")},
    "/jobs/{id}": {"parameters": ID_PARAM,
                   "get": _id("getJob", _op(
                       "A delivery job with its attempts (support and admins: any job; "
                       "marketers: only a campaign's jobs, without payload)", 200, JOB,
                       400, 404))},
    "/suppressions": {
        "get": _id("listSuppressions", {**_op(
            "Suppressed addresses, newest first (or by address with q), keyset-paged",
            200, {"type": "object", "required": ["suppressions", "next"],
                  "properties": {"suppressions": {"type": "array", "items": SUPPRESSION},
                                 "next": {"type": ["string", "null"]}}}, 422),
            "parameters": [
                {"name": n, "in": "query", "required": False, "schema": schema,
                 "description": d} for n, schema, d in (
                    ("email", TEXT, "exactly this address"),
                    ("q", TEXT, "addresses starting with this"),
                    ("reason", {"type": "string", "enum": ["", *SUPPRESSION_REASONS]},
                     "bounced, unsubscribed, complaint or manual (empty: any)"),
                    ("after", {"type": "string", "pattern": f"^$|{suppressions.CURSOR}"},
                     "the previous page's next"),
                    ("limit", {"type": "integer", "minimum": 1, "maximum": 1000},
                     "1 to 1000 (default 50)"))]}),
        "post": _id("addSuppression", _with_links(_also(_op(
            "Suppress an address (200 with created=false if it already is)",
            201, SUPPRESSION_ADDED, 400, 413, 422, request=_request(["email"], {
                "email": EMAIL,
                "reason": {"type": ["string", "null"], "enum": [*SUPPRESSION_REASONS, None]},
                "note": NOTE})),
            200, "already suppressed: nothing changed", SUPPRESSION_ADDED),
            201, _links(DeleteSuppression=("deleteSuppression", {
                "parameters": {"email": "$response.body#/email"}})))),
    },
    "/personal-data/export": {"post": _id("exportPersonalData", _op(
        "Everything SendDock holds about one address (GDPR art. 15): subscriber and "
        "attributes, memberships, consent records, jobs with their attempts, tracking and "
        "feedback events, suppressions; audited", 200, {"type": "object"}, 400, 413, 422,
        request=_request(["email"], {"email": EMAIL})))},
    "/personal-data/erase": {"post": _id("erasePersonalData", _op(
        "Erase one address (GDPR art. 17): subscriber, memberships, events and consent "
        "records deleted, jobs keep their counts without the address, the suppression kept "
        "as a hash; audited", 200, {"type": "object", "required": ["erased", "counts"],
                                    "properties": {"erased": {"type": "boolean"},
                                                   "counts": {"type": "object"}}},
        400, 413, 422, request=_request(["email"], {"email": EMAIL})))},
    "/suppressions/{email}": {
        "parameters": [{"name": "email", "in": "path", "required": True,
                        "schema": {"type": "string", "pattern": rules.NOT_BLANK}},
                       {"name": "note", "in": "query", "required": False, "schema": NOTE,
                        "description": "why (audit log)"}],
        "delete": {"operationId": "deleteSuppression",
                   "summary": "Clear the address: the next campaign includes it again",
                   "responses": {"204": {"description": "cleared"},
                                 **_errors(401, 403, 404, 422)}},
    },
    "/verifications": {"post": _id("createVerification", _with_links(_op(
        "Enqueue a verification email (202 at once; an Idempotency-Key header or a live job "
        "for the same user and address returns that job with existing=true; another "
        "address replaces a job still waiting, 409 while it is being sent; 429 + "
        "Retry-After inside the resend cooldown after the last email to the same address: "
        "the same pipeline and rules as POST /messages with kind verification)",
        202, VERIFICATION, 400, 409, 413, 422, 429, 503, request=_request(
            ["user_id", "email", "verify_url"], {
                "user_id": USER_ID, "email": EMAIL, "verify_url": VERIFY_URL})),
        202, _links(GetJob=("getJob", BY_ID), Resend=("resendVerification", {
            # The user of the job answered (with an Idempotency-Key used before, that is
            # the key's user, not necessarily the one in this request).
            "requestBody": {"user_id": "$response.body#/user_id"}}))))},
    "/verifications/resend": {"post": _id("resendVerification", _op(
        "Resend the user's verification email (429 + Retry-After inside the cooldown; a "
        "still-waiting job is reused, reused=true)", 202, VERIFICATION,
        400, 404, 409, 422, 429, 503, request=_request(["user_id"], {"user_id": USER_ID})))},
}

KIND_EXAMPLE = {
    "class": "lifecycle", "description": "Day-3 onboarding reminder",
    "subject": "{{ data.first_name }}, your workspace is waiting",
    "text": "Hi {{ data.first_name }},\nyou signed up on {{ event.at }}: finish setting up at "
            "{{ data.setup_url }}\n",
    "html": "<p>Hi {{ data.first_name }}, <a href=\"{{ data.setup_url }}\">finish setting "
            "up</a>.</p>",
    "retry_schedule": [300, 1800, 7200], "resend_cooldown": 3600, "dedupe_window": 86400,
    "sample_data": {"first_name": "Ada", "setup_url": "https://app.example/setup"}}
KIND: dict[str, Any] = {"type": "object",
                        "required": ["name", "class", "subject", "active", "version"],
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,39}$"},
            "class": {"type": "string", "enum": ["critical", "lifecycle"]},
            "description": {"type": "string"}, "subject": {"type": "string"},
            "text": {"type": ["string", "null"]}, "html": {"type": ["string", "null"]},
            "retry_schedule": {"type": ["array", "null"], "items": {"type": "integer"},
                               "description": "seconds between attempts; null: the "
                                              "setting's default (built-in kind)"},
            "resend_cooldown": {"type": ["integer", "null"]},
            "dedupe_window": {"type": "integer",
                              "description": "seconds; 0 = no window"},
            "active": {"type": "boolean"}, "builtin": {"type": "boolean"},
            "version": {"type": "integer"}, "priority": {"type": "integer"},
            "sample_data": {"type": "object"}, "sample_event": {"type": "object"},
            "class_defaults_applied": {
                "type": "object", "description": "PUT only: after a class change, each "
                "timing that took the new class's default (left out, null or sent back "
                "unchanged): {field: {from, to}}; a timing given a new value keeps it"}}}
KIND_BODY = {"type": "object", "properties": {
    **{k: v for k, v in KIND["properties"].items()
       if k not in ("name", "builtin", "version", "priority", "class_defaults_applied")},
    "description": {"type": "string", "maxLength": kinds_input.MAX_DESCRIPTION},
    "subject": {"type": "string", "maxLength": kinds_input.MAX_TEMPLATE,
                "pattern": rules.NOT_BLANK},
    **{body: {"type": ["string", "null"], "maxLength": kinds_input.MAX_TEMPLATE}
       for body in ("text", "html")},
    "retry_schedule": {"type": ["array", "null"], "maxItems": kinds_input.MAX_SCHEDULE,
                       "items": {"type": "integer", "minimum": 0,
                                 "maximum": kinds_input.MAX_DELAY},
                       "description": "seconds between attempts; [] never retries; null: "
                                      "the class's default (the built-in kind: the "
                                      "setting's)"},
    "resend_cooldown": {"type": ["integer", "null"], "minimum": 0,
                        "maximum": kinds_input.MAX_COOLDOWN,
                        "description": "seconds; null: as for retry_schedule"},
    "dedupe_window": {"type": "integer", "minimum": 0, "maximum": kinds_input.MAX_WINDOW,
                      "description": "seconds; 0 = no window"},
    "class": {"type": "string", "enum": ["critical", "lifecycle"],
              "default": kinds_input.DEFAULT_CLASS,
              "description": "a new kind without one is lifecycle mail"},
    **{sample: {"type": ["object", "null"], "description": "what the preview renders with "
                                                           "(null: nothing, {})"}
       for sample in ("sample_data", "sample_event")}},
    "additionalProperties": False,
    "example": KIND_EXAMPLE}
EVENT = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "maxLength": messages.MAX_EVENT_NAME, "pattern": rules.NOT_BLANK},
    "id": {"type": ["string", "integer"]},
    "at": {"type": "string", "format": "date-time"}},
    "additionalProperties": True, "description": "what caused the message (at most 64 KB)"}
MESSAGE: dict[str, Any] = {
    "type": "object", "required": ["id", "status", "kind", "correlation_id", "flags"],
           "properties": {
               "id": {"type": "integer"}, "status": {"type": "string"},
               "kind": {"type": "string"}, "correlation_id": {"type": "string"},
               "flags": {"type": "array", "items": {"type": "string"}},
               "email": {"type": "string"}, "user_id": {"type": "string"},
               "created_at": {"type": "string"},
               "send_at": {"type": ["string", "null"], "format": "date-time"},
               "data": {"type": "object"}, "event": {"anyOf": [EVENT, {"type": "null"}]},
               "existing": {"type": "boolean"},
               "existing_because": {"type": ["string", "null"], "enum": [
                   "idempotency_key", "dedupe_window", "live", None]},
               "reused": {"type": "boolean"}}}
KIND_NAME = {"type": "string", "pattern": states.KIND_NAME}
MESSAGE_BODY = _request(["kind", "user_id", "email"], {
    "kind": KIND_NAME, "user_id": USER_ID, "email": EMAIL,
    "data": {"type": "object", "description": "what the template sees as data (≤ 64 KB)"},
    "event": EVENT,
    "send_at": {"type": "string", "format": "date-time", "pattern": messages.SEND_AT_PATTERN,
                "description": "schedule it (before the year 3000); a time in the past "
                               "sends at once"}},
    # The built-in verification kind's templates link to data.verify_url.
    **{"if": {"required": ["kind"], "properties": {"kind": {"const": kinds.BUILTIN}}},
       "then": {"required": ["data"], "properties": {"data": {
           "required": ["verify_url"], "properties": {"verify_url": VERIFY_URL}}}}},
    example={"kind": "onboarding", "user_id": "u-42", "email": "ada@example.com",
                "data": {"first_name": "Ada", "setup_url": "https://app.example/setup"},
                "event": {"name": "signup", "id": "evt_9f2", "at": "2026-12-01T09:00:00Z"},
                "send_at": "2026-12-04T09:00:00Z"})
IDEMPOTENCY = [{"name": "Idempotency-Key", "in": "header", "required": False,
                "schema": {"type": "string", "maxLength": verifications.MAX_IDEMPOTENCY_KEY,
                           "pattern": rules.PRINTABLE_ASCII_NOT_BLANK},
                "description": "the same key returns the same message, whatever its state"}]
PATHS["/kinds"] = {"get": _op("Every transactional kind", 200, {
    "type": "object", "required": ["kinds"],
    "properties": {"kinds": {"type": "array", "items": KIND}}})}
PATHS["/kinds/{name}"] = {
    "parameters": [{"name": "name", "in": "path", "required": True, "schema": KIND_NAME}],
    "get": _op("One kind", 200, KIND, 404, 422),
    "put": _also(_op("Create (201) or edit (200) a kind; fields left out keep their value "
                     "(a new kind's: its class's defaults). Template errors answer 422 with "
                     "the template and line; a name that is not one path segment (an "
                     "encoded '/') reaches no kind: 404; the built-in kind stays critical "
                     "and active, and a kind keeps a subject and a text or an HTML "
                     "template (a new one must be given them): asking otherwise is 409",
                     201, KIND, 400, 404, 409, 413, 422, request=KIND_BODY),
                 200, "edited", KIND)}
PATHS["/messages"] = {
    "post": {**_op("Enqueue a message of a kind (202 at once). One message per user, kind "
                   "and dedupe window: asking again inside it returns that message with "
                   "existing=true; unknown kind: 404 listing the known kinds; kind "
                   "verification keeps POST /verifications' rules (one live job per user, "
                   "another address replaces a waiting one, 429 + Retry-After inside the "
                   "cooldown)", 202, MESSAGE,
                   400, 404, 409, 413, 422, 429, 503, request=MESSAGE_BODY),
             "parameters": IDEMPOTENCY},
    "delete": {**_op("Cancel the user's messages of the kind that are still waiting (the "
                     "user did the thing); answers how many", 200, {
                         "type": "object", "required": ["cancelled", "ids", "in_flight"],
                         "properties": {"kind": {"type": "string"},
                                        "user_id": {"type": "string"},
                                        "cancelled": {"type": "integer"},
                                        "ids": {"type": "array", "items": {"type": "integer"}},
                                        "in_flight": {"type": "integer"}}}, 404, 422),
               "parameters": [{"name": n, "in": "query", "required": True, "schema": schema}
                              for n, schema in (
                                  ("kind", {"type": "string", "pattern": states.KIND_NAME}),
                                  ("user_id", USER_ID["oneOf"][0]))]}}
BATCH_RESULT = {"type": "object", "required": ["index", "http_status"], "properties": {
    **MESSAGE["properties"], "index": {"type": "integer"}, "http_status": {"type": "integer"},
    "error": {"type": "object", "required": ["message", "fields"], "properties": {
        "message": {"type": "string"}, "fields": {"type": "object"}}}}}
PATHS["/messages/batch"] = {"post": _op(
    "Enqueue up to 500 messages in one call (Postmark's batch, SES's bulk send): 207 with "
    "one result per item, in order — http_status 202 and the message (existing and "
    "existing_because as for POST /messages), or the item's own status (404, 409, 422, "
    "429, 503) and error naming its fields. A bad item never refuses the others; each "
    "item keeps POST /messages' rules (dedupe window, cooldown, backlog limit). The "
    "messages queue behind single POST /messages requests of their kind's class (an "
    "import never delays a signup's verification)",
    207, {"type": "object", "required": ["accepted", "rejected", "results"], "properties": {
        "accepted": {"type": "integer"}, "rejected": {"type": "integer"},
        "results": {"type": "array", "items": BATCH_RESULT}}},
    400, 413, 422, request=_request(["messages"], {"messages": {
        "type": "array", "minItems": 1, "maxItems": messages.MAX_BATCH,
        # Each object is judged on its own and answered in its own result (a 422 there
        # names its field); only an item that is not an object refuses the call.
        "items": {"type": "object",
                  "description": "a POST /messages body, plus an optional idempotency_key "
                                 "(the Idempotency-Key header's rules)"}}}))}
PATHS["/messages/resend"] = {"post": _op(
    "Resend the user's latest message of the kind (429 + Retry-After inside the kind's "
    "cooldown; a still-waiting one is reused, reused=true)", 202, MESSAGE,
    400, 404, 409, 422, 429, 503, request=_request(["kind", "user_id"], {
        "kind": KIND_NAME, "user_id": USER_ID}))}


# Segments and layouts: the conditions' table is
# workers.queue.audience's; a value the schema allows is one the server takes.
SCALAR = {"anyOf": [{"type": "string", "maxLength": segments.MAX_VALUE,
                     "pattern": rules.NOT_BLANK}, {"type": ["number", "boolean"]}]}
ATTRIBUTE_KEY = {"type": "string", "maxLength": segments.MAX_KEY, "pattern": rules.NOT_BLANK,
                 "description": "the subscriber attribute (a CSV column), e.g. plan"}


def _condition(field: str, ops: list[str], value: dict[str, Any] | None,
               key: bool = False) -> dict[str, Any]:
    properties: dict[str, Any] = {"field": {"const": field}, "op": {"enum": ops}}
    if key:
        properties["key"] = ATTRIBUTE_KEY
    # Not used, but the body is still checked for text PostgreSQL cannot store.
    properties["value"] = value if value is not None else {
        "$ref": STORABLE_REF, "description": "not used (any storable value is ignored)"}
    return _request(["field", "op", *(["key"] if key else []),
                     *(["value"] if value is not None else [])], properties)


CONDITION = {"anyOf": [
    _condition("attribute", ["eq", "ne", "contains"], SCALAR, key=True),
    _condition("attribute", sorted(audience.LIST_OPS), {
        "type": "array", "minItems": 1, "maxItems": segments.MAX_CHOICES, "items": SCALAR},
        key=True),
    _condition("attribute", sorted(audience.NO_VALUE_OPS), None, key=True),
    _condition("subscribed", ["after", "before"], {
        "type": "string", "format": "date", "pattern": segments.DATE_PATTERN,
        "description": "a UTC day: after = on or after it, before = before it"}),
    _condition("activity", sorted(audience.ACTIVITY_OPS), {
        "type": "integer", "minimum": 1, "maximum": 3650,
        "description": "days; needs open/click tracking on the server (409 otherwise)"})],
    "description": "one condition; a segment's conditions must all hold"}
CONDITIONS = {"type": "array", "maxItems": audience.MAX_CONDITIONS, "items": CONDITION}
AUDIENCE = {"type": "object", "required": ["members", "suppressed", "inactive",
                                           "will_receive"],
            "properties": {k: {"type": "integer"} for k in (
                "members", "suppressed", "inactive", "will_receive", "list_members")}}
SEGMENT = {"type": "object", "required": ["id", "list_id", "name", "conditions"],
           "properties": {"id": {"type": "integer"}, "list_id": {"type": "integer"},
                          "name": {"type": "string"}, "conditions": {"type": "array"},
                          "created_at": {"type": "string"}, "updated_at": {"type": "string"},
                          "audience": AUDIENCE}}
SEGMENT_BODY = _request(["name"], {
    "name": {"type": "string", "maxLength": segments.MAX_NAME, "pattern": rules.NOT_BLANK},
    "conditions": CONDITIONS},
    example={"name": "Pro customers in Spain and Mexico", "conditions": [
        {"field": "attribute", "key": "plan", "op": "eq", "value": "pro"},
        {"field": "attribute", "key": "country", "op": "in", "value": ["ES", "MX"]},
        {"field": "subscribed", "op": "after", "value": "2026-01-01"}]})
LAYOUT = {"type": "object", "required": ["id", "name", "html", "postal_address"],
          "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                         "html": {"type": "string"}, "postal_address": {"type": "string"},
                         "created_at": {"type": "string"}, "updated_at": {"type": "string"},
                         "campaigns": {"type": "integer"}}}
LAYOUT_BODY = _request(["name", "html"], {
    "name": {"type": "string", "maxLength": layouts.MAX_NAME, "pattern": rules.NOT_BLANK},
    "html": {"type": "string", "maxLength": MAX_TEMPLATE_CHARS, "allOf": [
        {"pattern": CONTENT_PLACEHOLDER.pattern}, {"pattern": UNSUBSCRIBE_PLACEHOLDER.pattern}],
        "description": "an HTML template with {{ content }} exactly once (the campaign's "
                       "body), {{ unsubscribe_url }} and, if wanted, {{ postal_address }}; "
                       "one that does not compile is 422 with its line"},
    "postal_address": {"type": ["string", "null"], "maxLength": layouts.MAX_ADDRESS}},
    example={"name": "Newsletter", "postal_address": "Calle Mayor 1, 28013 Madrid",
             "html": layouts.STARTER})
SEGMENT_ID = [{"name": "id", "in": "path", "required": True, "schema": ID_SCHEMA}]
PATHS["/lists/{id}/segments"] = {
    "parameters": ID_PARAM,
    "get": _id("listSegments", _op("The list's saved segments", 200, {
        "type": "object", "required": ["segments"],
        "properties": {"segments": {"type": "array", "items": SEGMENT}}}, 400, 404)),
    "post": _id("createSegment", _with_links(_op(
        "Save a segment of the list (all its conditions must hold); answers it with who it "
        "picks right now. A bad condition is 422 naming it (conditions[i].field|op|key|"
        "value); a name the list already uses, or an activity condition on a server "
        "without open/click tracking, 409", 201, SEGMENT, 400, 404, 409, 413, 422,
        request=SEGMENT_BODY),
        201, _links(GetSegment=("getSegment", BY_ID), UpdateSegment=("updateSegment", BY_ID),
                    DeleteSegment=("deleteSegment", BY_ID))))}
PATHS["/lists/{id}/segments/count"] = {
    "parameters": ID_PARAM,
    "post": _id("countSegment", _op(
        "Who these conditions pick on the list right now, by the send's own rules "
        "(nothing saved)", 200, {"type": "object", "required": ["conditions", "audience"],
                                 "properties": {"conditions": {"type": "array"},
                                                "audience": AUDIENCE}},
        400, 404, 409, 413, 422,
        request=_request([], {"conditions": CONDITIONS})))}
PATHS["/segments/{id}"] = {
    "parameters": SEGMENT_ID,
    "get": _id("getSegment", _op("A segment with who it picks right now", 200, SEGMENT,
                                 400, 404)),
    "put": _id("updateSegment", _op(
        "Change a segment (a campaign already sent keeps the conditions it was sent with)",
        200, SEGMENT, 400, 404, 409, 413, 422, request=SEGMENT_BODY)),
    "delete": {"operationId": "deleteSegment",
               "summary": "Delete a segment (409 while a draft or scheduled campaign is to "
                          "be sent to it)",
               "responses": {"204": {"description": "deleted"},
                             **_errors(400, 401, 403, 404, 409)}}}
PATHS["/layouts"] = {
    "get": _id("listLayouts", _op("Every layout", 200, {
        "type": "object", "required": ["layouts"],
        "properties": {"layouts": {"type": "array", "items": LAYOUT}}})),
    "post": _id("createLayout", _with_links(_op(
        "Save a layout (campaigns pick it with layout_id). 422 naming the field when "
        "{{ content }} or {{ unsubscribe_url }} is missing or it does not compile; 409 for "
        "a name in use", 201, LAYOUT, 400, 409, 413, 422, request=LAYOUT_BODY),
        201, _links(GetLayout=("getLayout", BY_ID), UpdateLayout=("updateLayout", BY_ID),
                    DeleteLayout=("deleteLayout", BY_ID))))}
PATHS["/layouts/{id}"] = {
    "parameters": ID_PARAM,
    "get": _id("getLayout", _op("A layout", 200, LAYOUT, 400, 404)),
    "put": _id("updateLayout", _op(
        "Change a layout (409 while a campaign using it is scheduled, sending or paused)",
        200, LAYOUT, 400, 404, 409, 413, 422, request=LAYOUT_BODY)),
    "delete": {"operationId": "deleteLayout",
               "summary": "Delete a layout no campaign uses (409 otherwise)",
               "responses": {"204": {"description": "deleted"},
                             **_errors(400, 401, 403, 404, 409)}}}
_CAMPAIGN_BODY = PATHS["/campaigns"]["post"]["requestBody"]["content"]["application/json"]
_CAMPAIGN_BODY["schema"]["properties"].update({
    "segment_id": {"type": ["integer", "null"], "minimum": 0, "maximum": BIGINT_MAX,
                   "description": "send to this segment of the list (null: the whole "
                                  "list); 404 if there is none, 409 if it is another list's"},
    "layout_id": {"type": ["integer", "null"], "minimum": 0, "maximum": BIGINT_MAX,
                  "description": "put the HTML body in this layout (404 if there is none)"}})
_FIGURE = {"type": "object", "required": ["total", "unique"], "additionalProperties": False,
           "properties": {"total": {"type": "integer", "minimum": 0},
                          "unique": {"type": "integer", "minimum": 0}}}
_COUNT = {"type": "integer", "minimum": 0}
CAMPAIGN_STATS = {
    "type": "object", "additionalProperties": False,
    "required": ["campaign_id", "tracking", "sent", "opens", "clicks", "links", "by",
                 "timeline", "unsubscribes", "bounces", "complaints"],
    "properties": {
        "campaign_id": {"type": "integer"},
        "tracking": {"type": "object", "required": ["track_opens", "track_clicks", "archive"],
                     "additionalProperties": False, "properties": {
                         k: {"type": "boolean"} for k in ("track_opens", "track_clicks",
                                                          "archive")}},
        "sent": _COUNT, "opens": _FIGURE, "clicks": _FIGURE,
        "links": {"type": "array", "items": {
            "type": "object", "required": ["id", "url", "total", "unique"],
            "additionalProperties": False, "properties": {
                "id": {"type": "integer"}, "url": {"type": "string"}, "total": _COUNT,
                "unique": _COUNT}}},
        "by": {"type": "string", "enum": list(tracking.BUCKETS)},
        "timeline": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["at", "opens", "unique_opens", "clicks", "unique_clicks"],
            "properties": {"at": {"type": "string", "format": "date-time"},
                           "opens": _COUNT, "unique_opens": _COUNT, "clicks": _COUNT,
                           "unique_clicks": _COUNT}}},
        "unsubscribes": _COUNT, "bounces": _COUNT, "complaints": _COUNT}}
PATHS["/campaigns/{id}/stats"] = {"parameters": ID_PARAM, "get": _id("getCampaignStats", {
    **_op("A campaign's opens and clicks (total and unique, per link, per hour or day in "
          "UTC; zero while tracking is off, the default) beside its unsubscribes, bounces "
          "and complaints", 200, CAMPAIGN_STATS, 400, 404, 422),
    "parameters": [{"name": "by", "in": "query", "required": False,
                    "schema": {"type": "string", "enum": ["", *tracking.BUCKETS]},
                    "description": "the timeline's buckets: hour (default, also when "
                                   "empty) or day"}]})}

PATHS["/campaigns/{id}/send"]["post"]["requestBody"] = {
    "required": False, "description": "optional: schedule for a later time instead of now",
    **_json({"type": "object", "additionalProperties": False, "properties": {
        "at": {"type": ["string", "null"], "format": "date-time",
               "description": "ISO 8601 with a zone, e.g. 2026-12-01T09:00:00Z"}}})}
# Sequences, their enrollments and events (docs/sequences.md).
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_TEXT = {"type": ["string", "null"]}
SEQUENCE_STEP = {"type": "object", "required": ["id", "position", "type"], "properties": {
    "id": {"type": "integer"}, "position": {"type": "integer"},
    "type": {"type": "string", "enum": list(sequences.STEP_TYPES)},
    "subject": _NULLABLE_TEXT, "text_body": _NULLABLE_TEXT, "html_body": _NULLABLE_TEXT,
    "wait_seconds": _NULLABLE_INT, "window_start": _NULLABLE_INT, "window_end": _NULLABLE_INT,
    "condition": {"type": ["object", "null"]}, "if_false": _NULLABLE_TEXT,
    "skip": {"type": "integer"}, "version": {"type": "integer"}}}
SEQUENCE = {"type": "object", "required": ["id", "name", "status", "trigger_type", "steps"],
            "properties": {
                "id": {"type": "integer"}, "name": {"type": "string"},
                "status": {"type": "string", "enum": ["active", "paused", "archived"]},
                "trigger_type": {"type": "string", "enum": list(sequences.TRIGGERS)},
                "list_id": _NULLABLE_INT, "trigger_event": _NULLABLE_TEXT,
                "goal_event": _NULLABLE_TEXT, "reentry_days": _NULLABLE_INT,
                "from_addr": _NULLABLE_TEXT, "layout_id": _NULLABLE_INT,
                "track_opens": {"type": "boolean"}, "track_clicks": {"type": "boolean"},
                "steps": {"type": "array", "items": SEQUENCE_STEP}}}
_EVENT_NAME = {"type": "string", "pattern": sequences.EVENT_NAME, "maxLength": 100}
_NOT_BLANK = {"type": "string", "pattern": rules.NOT_BLANK}
_BODY_TEXT = {"type": ["string", "null"], "pattern": rules.NO_NUL}
SEQUENCE_CONDITION = {"oneOf": [
    {"type": "object", "required": ["test", "attribute"], "additionalProperties": False,
     "properties": {"test": {"const": "attribute"}, "attribute": _NOT_BLANK,
                    "value": {"type": "string"}}},
    {"type": "object", "required": ["test", "event"], "additionalProperties": False,
     "properties": {"test": {"const": "event"}, "event": _EVENT_NAME}},
    {"type": "object", "required": ["test"], "additionalProperties": False,
     "properties": {"test": {"enum": list(sequences.TRACKED_TESTS)}}}],
    "description": "attribute: the subscriber's attribute equals value (as text); event: "
                   "the event was posted for the person since they entered; opened / "
                   "clicked: the person opened (or clicked a link in) the message of the "
                   "last email step before this one (needs the sequence's track_opens / "
                   "track_clicks)"}
_STEP_PROPERTIES: dict[str, Any] = {
    "type": {"type": "string", "enum": list(sequences.STEP_TYPES)},
    "subject": _NOT_BLANK, "text_body": _BODY_TEXT, "html_body": _BODY_TEXT,
    "wait_seconds": {"type": "integer", "minimum": 0, "maximum": sequences.MAX_WAIT},
    "window_start": {"type": "integer", "minimum": 0, "maximum": 23},
    "window_end": {"type": "integer", "minimum": 0, "maximum": 24},
    "condition": SEQUENCE_CONDITION,
    "if_false": {"type": "string", "enum": ["exit", "skip"]},
    "skip": {"type": "integer", "minimum": 1, "maximum": 100}}
_WINDOW = {"dependentRequired": {"window_start": ["window_end"],
                                 "window_end": ["window_start"]}}


def _when(kind: str, then: dict[str, Any]) -> dict[str, Any]:
    return {"if": {"required": ["type"], "properties": {"type": {"const": kind}}},
            "then": then}


_NEEDS = [
    _when("email", {"required": ["subject"], "anyOf": [
        {"required": ["text_body"], "properties": {"text_body": {"type": "string",
                                                                 "minLength": 1}}},
        {"required": ["html_body"], "properties": {"html_body": {"type": "string",
                                                                 "minLength": 1}}}]}),
    _when("wait", {"required": ["wait_seconds"]}),
    _when("condition", {"required": ["condition"]})]
_STEP_DESCRIPTION = ("email: subject and a text or HTML body (templates as a campaign's); "
                     "wait: wait_seconds, then optionally the next UTC window_start:00 to "
                     "window_end:00 (the same hour twice: no window); condition: "
                     "condition and if_false (exit, or skip the next skip steps)")
STEP_BODY = _request(["type"], _STEP_PROPERTIES, allOf=_NEEDS, **_WINDOW,
                     description=_STEP_DESCRIPTION)
NEW_STEP_BODY = _request(["type"], {**_STEP_PROPERTIES, "position": {
    "type": "integer", "minimum": 1, "maximum": BIGINT_MAX,
    "description": "before the live step at this position (1-based; past the end: last)"}},
    allOf=_NEEDS, **_WINDOW, description=_STEP_DESCRIPTION)
STEP_CHANGE_BODY = _request([], _STEP_PROPERTIES, **_WINDOW, description=(
    "the fields to change (a step keeps its type); a change that leaves the step without "
    "what its type needs is 409"))
_SEQUENCE_PROPERTIES: dict[str, Any] = {
    "name": {"type": "string", "maxLength": sequences.MAX_NAME, "pattern": rules.NOT_BLANK},
    "trigger_type": {"type": "string", "enum": list(sequences.TRIGGERS)},
    "list_id": {"type": ["integer", "null"], "minimum": 1, "maximum": BIGINT_MAX},
    "trigger_event": {"anyOf": [_EVENT_NAME, {"type": "null"}]},
    "goal_event": {"anyOf": [_EVENT_NAME, {"type": "null"}]},
    "reentry_days": {"type": ["integer", "null"], "minimum": 0, "maximum": 36500,
                     "description": "null: once ever; N: again N days after the last entry"},
    "from_addr": FROM,
    "layout_id": {"type": ["integer", "null"], "minimum": 1, "maximum": BIGINT_MAX},
    "track_opens": {"type": "boolean", "description": "track opens of the sequence's "
                    "messages (an open pixel; default false)"},
    "track_clicks": {"type": "boolean", "description": "track clicks of the links written "
                     "out in full in its email steps (default false)"}}
SEQUENCE_BODY = _request(["name", "trigger_type"], {
    **_SEQUENCE_PROPERTIES, "steps": {"type": "array", "items": STEP_BODY}}, allOf=[
        {"if": {"required": ["trigger_type"],
                "properties": {"trigger_type": {"const": "event"}}},
         "then": {"required": ["trigger_event"],
                  "properties": {"trigger_event": _EVENT_NAME}},
         "else": {"required": ["list_id"],
                  "properties": {"list_id": {"type": "integer"}}}}])
SEQUENCE_CHANGE_BODY = _request([], _SEQUENCE_PROPERTIES, description=(
    "the fields to change; a change that leaves the trigger without its list or event is "
    "409"))
VISIT = {"type": "object", "required": ["step_id", "at", "outcome"], "properties": {
    "step_id": {"type": "integer"}, "position": {"type": "integer"},
    "type": {"type": "string"}, "removed": {"type": "boolean"}, "job_id": _NULLABLE_INT,
    "job_status": _NULLABLE_TEXT, "at": {"type": "string"},
    "outcome": {"type": "string", "enum": ["sent", "waited", "continued", "skipped",
                                           "exited"]}}}
PERSON = {"type": "object", "required": ["subscriber", "enrollments"], "properties": {
    "subscriber": {"type": "object"},
    "enrollments": {"type": "array", "items": {
        "type": "object", "required": ["id", "sequence_id", "status", "visits"],
        "properties": {"id": {"type": "integer"}, "sequence_id": {"type": "integer"},
                       "status": {"type": "string",
                                  "enum": ["active", "paused", "done", "exited"]},
                       "exit_reason": _NULLABLE_TEXT, "step_id": _NULLABLE_INT,
                       "at_position": _NULLABLE_INT, "due_at": {"type": "string"},
                       "visits": {"type": "array", "items": VISIT}}}}}}
SEQ_ID = [{"name": "id", "in": "path", "required": True, "schema": ID_SCHEMA}]
STEP_ID = [*SEQ_ID, {"name": "step", "in": "path", "required": True, "schema": ID_SCHEMA}]
PATHS["/sequences"] = {
    "get": _id("listSequences", _op("Every sequence", 200, {
        "type": "object", "required": ["sequences"],
        "properties": {"sequences": {"type": "array"}}})),
    "post": _id("createSequence", _with_links(_op(
        "Create a sequence with its steps (422 names the bad field)", 201, SEQUENCE, 400,
        404, 422, request=SEQUENCE_BODY), 201, _links(
            GetSequence=("getSequence", BY_ID), UpdateSequence=("updateSequence", BY_ID),
            SequenceFunnel=("sequenceFunnel", BY_ID),
            AddSequenceStep=("addSequenceStep", BY_ID),
            PauseSequence=("pauseSequence", BY_ID),
            ResumeSequence=("resumeSequence", BY_ID),
            ArchiveSequence=("archiveSequence", BY_ID))))}
PATHS["/sequences/{id}"] = {
    "parameters": SEQ_ID,
    "get": _id("getSequence", _op("A sequence and its live steps", 200, SEQUENCE, 404)),
    "put": _id("updateSequence", _op("Change a sequence's trigger, goal or re-entry", 200,
                                     SEQUENCE, 400, 404, 409, 422,
                                     request=SEQUENCE_CHANGE_BODY))}
for _action, _summary in (("pause", "Pause: due steps wait until it resumes"),
                          ("resume", "Resume a paused sequence"),
                          ("archive", "Archive: open enrollments end (reason archived)")):
    PATHS[f"/sequences/{{id}}/{_action}"] = {"parameters": SEQ_ID, "post": _id(
        f"{_action}Sequence", _op(_summary, 200, SEQUENCE, 400, 404, 409, 422))}
PATHS["/sequences/{id}/funnel"] = {"parameters": SEQ_ID, "get": _id("sequenceFunnel", _op(
    "Per step: entered, sent, opened, clicked (tracked messages; a click counts as an "
    "open), exited there, waiting there; and how enrollments ended", 200,
    {"type": "object", "required": ["steps", "enrollments"],
     "properties": {"steps": {"type": "array"}, "enrollments": {"type": "object"}}}, 404))}
PATHS["/sequences/{id}/steps"] = {"parameters": SEQ_ID, "post": _id("addSequenceStep", _op(
    "Add a step (at the end, or before the live step at position)", 201, SEQUENCE_STEP,
    400, 404, 409, 422, request=NEW_STEP_BODY))}
PATHS["/sequences/{id}/steps/{step}"] = {
    "parameters": STEP_ID,
    "put": _id("updateSequenceStep", _op(
        "Change a step's content (sends not made yet use it; its type stays)", 200,
        SEQUENCE_STEP, 400, 404, 409, 422, request=STEP_CHANGE_BODY)),
    "delete": _id("removeSequenceStep", _op(
        "Remove a step: enrollments waiting at it move to the next", 200,
        {"type": "object", "required": ["moved"], "properties": {"moved": {
            "type": "integer"}}}, 404, 409))}
PATHS["/sequences/{id}/order"] = {"parameters": SEQ_ID, "put": _id("reorderSequenceSteps", _op(
    "Put the live steps in this order (every step id once)", 200,
    {"type": "object", "required": ["steps"],
     "properties": {"steps": {"type": "array", "items": SEQUENCE_STEP}}}, 400, 404, 409,
    422, request=_request(["order"], {"order": {"type": "array", "items": ID_SCHEMA}},
                          description="every live step id once (else 409)")))}
PATHS["/enrollments"] = {"get": _id("personEnrollments", {
    **_op("A person's enrollments, each step's time, job and outcome", 200, PERSON, 404,
          422),
    "parameters": [{"name": "email", "in": "query", "required": True,
                    "schema": EMAIL}]})}
_EVENT_PROPERTIES: dict[str, Any] = {
    "name": _EVENT_NAME, "email": EMAIL, "user_id": USER_ID,
    "data": {"type": "object", "additionalProperties": {"$ref": STORABLE_REF},
             "description": "at most 16 KB of JSON; email steps see it as data"}}
_ONE_EVENT = _request(["name"], _EVENT_PROPERTIES,
                      anyOf=[{"required": ["email"]}, {"required": ["user_id"]}])
PATHS["/events"] = {"post": _id("postEvent", _op(
    "Record an event of a person (email, or a user_id sent with an email before), or up "
    f"to {sequences.MAX_EVENTS} of them in one request (events): ends the enrollments "
    "whose goal it is, enrols into the sequences it triggers; all in one statement", 201,
    {"type": "object", "required": ["enrolled", "exited"], "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"},
        "subscriber_id": {"type": "integer"},
        "events": {"type": "array", "items": {"type": "object"}, "description": "with "
                   "events: each recorded event (id, name, subscriber_id), in order"},
        "enrolled": {"type": "array"},
        "exited": {"type": "array", "items": {"type": "integer"}}}}, 400, 404, 422,
    request={"oneOf": [_ONE_EVENT, _request(["events"], {"events": {
        "type": "array", "minItems": 1, "maxItems": sequences.MAX_EVENTS,
        "items": _ONE_EVENT}})]}))}
PATHS["/openapi.json"] = {"get": {
    "operationId": "openapi", "summary": "This document (public: no token needed)", "security": [],
    "responses": {"200": {"description": "the OpenAPI document",
                          **_json({"type": "object", "required": ["openapi", "paths"]})}}}}

SCHEMAS: dict[str, Any] = {
    "Storable": STORABLE,
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "fields"],
        "properties": {"message": {"type": "string"}, "fields": {"type": "object"}}}}},
    "Campaign": {"type": "object",
                 "required": ["id", "status", "broadcast_id", "total", "counts"],
                 "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                "status": {"type": "string",
                                           "enum": list(states.Campaign.STATES)},
                                "broadcast_id": {"type": ["integer", "null"]},
                                "segment_id": {"type": ["integer", "null"]},
                                "layout_id": {"type": ["integer", "null"]},
                                "total": {"type": "integer"}, "counts": COUNTS}},
    "Job": {"type": "object", "required": ["id", "status", "attempts"],
            "properties": {"id": {"type": "integer"}, "status": {"type": "string"},
                           "kind": {"type": "string"}, "email": {"type": "string"},
                           "correlation_id": {"type": "string"},
                           "event": {"type": ["object", "null"],
                                     "description": "what caused it (transactional kinds)"},
                           "data": {"type": ["object", "null"],
                                    "description": "what its template saw as data"},
                           "attempts": {"type": "array"},
                           "events": {"type": "array", "description":
                                      "Bounces and complaints reported after acceptance "
                                      "(source, type, bounce, reason, effect)"}}},
}


_NOT_RULES = frozenset({"if", "example", "examples", "description", "summary", "enum",
                        "const", "default"})


def _storable(schema: Any) -> Any:
    """``schema`` with the rule every request obeys said in it: PostgreSQL stores no NUL,
    so no text anywhere in a request (keys of free-form objects included) may hold one
    (webapp.security answers 422 naming the field). A string without a pattern gets
    :data:`rules.NO_NUL`; an object with no word on its keys or extra values takes only
    storable ones."""
    if isinstance(schema, list):
        return [_storable(item) for item in schema]
    if not isinstance(schema, dict) or "$ref" in schema:
        return schema
    out = {k: v if k in _NOT_RULES else _storable(v) for k, v in schema.items()
           if k not in ("properties", "patternProperties")}
    for key in ("properties", "patternProperties"):
        if key in schema:
            out[key] = {name: _storable(sub) for name, sub in schema[key].items()}
    if _types(out) & {"string"} and "pattern" not in out and "enum" not in out:
        out["pattern"] = rules.NO_NUL
    if "object" in _types(out):
        out.setdefault("propertyNames", {"pattern": rules.NO_NUL})
        if out.get("additionalProperties", True) is True:
            out["additionalProperties"] = {"$ref": STORABLE_REF}
    if "array" in _types(out):
        out.setdefault("items", {"$ref": STORABLE_REF})
    return out


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind or ())


def _parameters(parameters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**p, "schema": _storable(p["schema"])} for p in parameters]


def _operation(op: dict[str, Any]) -> dict[str, Any]:
    op = {**op}
    if "parameters" in op:
        op["parameters"] = _parameters(op["parameters"])
    if "requestBody" in op:
        body = op["requestBody"]
        media = body["content"]["application/json"]
        op["requestBody"] = {**body, "content": {"application/json": {
            **media, "schema": _storable(media["schema"])}}}
    return op


# Every operation's parameters and request body through _storable, once.
REQUEST_PATHS = {path: {key: _parameters(value) if key == "parameters" else _operation(value)
                        for key, value in item.items()} for path, item in PATHS.items()}

# Receiver reports (docs/deliverability.md): the body is the report file itself, not JSON.
_REPORT = {"type": "object", "required": ["kind", "org_name", "report_id", "duplicate"],
           "properties": {"kind": {"type": "string",
                                   "enum": ["aggregate", "failure", "smtp_tls"]},
                          "org_name": {"type": "string"}, "report_id": {"type": "string"},
                          "domain": {"type": "string"}, "id": {"type": ["integer", "null"]},
                          "duplicate": {"type": "boolean"}, "records": {"type": "integer"}}}
_INGESTED = {"type": "object", "required": ["reports", "error"], "properties": {
    "filename": {"type": "string"},
    "error": {"type": ["string", "null"],
              "description": "why the file holds no readable report (then reports is empty "
                             "and the file is listed among the refused files)"},
    "reports": {"type": "array", "items": _REPORT}}}
REQUEST_PATHS["/reports"] = {
    "post": _id("uploadReport", {
        **_also(_op("Read and store one DMARC aggregate or failure report or SMTP TLS report "
                    "(201; 200 when every report in it was stored before, kept once by org "
                    "and report id, or when the file holds no readable report: then error "
                    "says why and the file is listed among the refused files)",
                    201, _INGESTED, 400, 413, 422),
                200, "nothing new: already stored, or no readable report (see error)",
                _INGESTED),
        "parameters": [{"name": "filename", "in": "query", "required": False,
                        "schema": {"type": "string", "pattern": rules.NO_NUL},
                        "description": "the file's name, shown in the lists"}],
        "requestBody": {"required": True, "description": (
            "the file as received, whatever its Content-Type: XML, JSON, gzip, zip, or an "
            "email message (RFC 5322) carrying one"), "content": {
                mime: {"schema": {"type": "string", "format": "binary", "minLength": 1}}
                for mime in (
                    "application/octet-stream", "application/gzip", "application/zip",
                    "message/rfc822")}}}),
    "get": _id("listReports", _op(
        "The latest stored receiver reports and refused files (newest first, 50 each)", 200,
        {"type": "object", "required": ["reports", "rejects"],
         "properties": {"reports": {"type": "array"}, "rejects": {"type": "array"}}})),
}


# The deliverability console (docs/deliverability.md) and warm-up (docs/design.md §33).
_RATE = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
_INT = {"type": "integer", "minimum": 0}
_DAYS = [{"name": "days", "in": "query", "required": False,
          "schema": {"type": "integer", "minimum": 1, "maximum": deliverability.MAX_SPAN},
          "description": "the period, in days back from today (default: 30)"}]
_DOMAIN_PARAM = [{"name": "domain", "in": "path", "required": True,
                  "schema": {"type": "string", "pattern": rules.NO_NUL},
                  "description": "a sending domain (a name that is no domain: 404)"}]
_SOURCE = {"type": "object", "required": ["ip", "ours", "messages", "pass_rate"],
           "properties": {"ip": {"type": "string"}, "ours": {"type": "boolean"},
                          "messages": _INT, "dmarc_pass": _INT, "spf_aligned": _INT,
                          "dkim_aligned": _INT, "pass_rate": _RATE,
                          "reporters": {"type": "array", "items": {"type": "string"}},
                          "dispositions": {"type": "object",
                                           "additionalProperties": _INT}}}
_DOMAIN_VIEW = {"type": "object", "required": [
    "domain", "days", "since", "messages", "rates", "ours", "not_ours", "per_day", "tls"],
    "properties": {
        "domain": {"type": "string"}, "days": _INT, "since": {"type": "string",
                                                               "format": "date"},
        "messages": _INT, "ours_messages": _INT, "not_ours_count": _INT,
        "rates": {"type": "object", "properties": {
            k: _RATE for k in ("spf", "dkim", "dmarc", "ours_dmarc")}},
        "networks": {"type": "array", "items": {"type": "string"}},
        "ours": {"type": "array", "items": _SOURCE},
        "not_ours": {"type": "array", "items": _SOURCE},
        "per_day": {"type": "array", "items": {"type": "object"}},
        "by_day_source": {"type": "array", "items": {"type": "object"}},
        "reporters": {"type": "array", "items": {"type": "object"}},
        "policy": {"type": "array", "items": {"type": "object"}},
        "tls": {"type": "array", "items": {"type": "object"}},
        "tls_ok": _INT, "tls_failed": _INT, "failure_reports": _INT,
        "threshold": {"type": "number"}}}
_PROVIDER_CELL = {"type": "object", "required": ["group", "accepted", "deferred", "bounced",
                                                 "complained", "complaint_rate"],
                  "properties": {"group": {"type": "string"}, "day": {"type": "string"},
                                 "accepted": _INT, "deferred": _INT, "bounced": _INT,
                                 "complained": _INT, "complaint_rate": _RATE}}
_PROVIDERS = {"type": "object", "required": ["days", "groups", "totals", "per_day"],
              "properties": {"days": _INT,
                             "groups": {"type": "array", "items": {"type": "string"}},
                             "names": {"type": "object"}, "thresholds": {"type": "object"},
                             "totals": {"type": "array", "items": _PROVIDER_CELL},
                             "per_day": {"type": "array", "items": _PROVIDER_CELL}}}
_NULLABLE_COUNT = {"type": ["integer", "null"], "minimum": 0}
_WARMUP = {"type": "object", "required": [
    "domain", "started_on", "day", "daily_cap", "hourly_cap", "sent_today", "sent_this_hour",
    "allowed_now", "custom_schedule", "finished"], "properties": {
        "domain": {"type": "string"}, "started_on": {"type": "string", "format": "date"},
        "day": {"type": "integer"}, "daily_cap": _NULLABLE_COUNT,
        "hourly_cap": _NULLABLE_COUNT, "sent_today": _INT, "sent_this_hour": _INT,
        "allowed_now": _NULLABLE_COUNT, "custom_schedule": {"type": "boolean"},
        "finished": {"type": "boolean", "description": "past the schedule's last day: no cap"}}}
_WARMUP_BODY = _request([], {
    "caps": {"type": ["array", "null"], "minItems": 1, "maxItems": warmup.MAX_DAYS,
             "items": {"type": "integer", "minimum": 1, "maximum": warmups.MAX_CAP},
             "description": "daily caps for days 1, 2, ... (null or absent: the built-in "
                            "ramp)"},
    "hour_share_percent": {"type": "integer", "minimum": 1, "maximum": 100,
                           "description": "the hourly cap as a share of the day's (25)"}})
REQUEST_PATHS["/domains/{domain}/deliverability"] = {
    "parameters": _DOMAIN_PARAM,
    "get": _id("getDomainDeliverability", {**_op(
        "What receivers reported about mail sent as the domain: DMARC pass and alignment "
        "rates, sources (ours and not ours), reporters, policies applied, TLS failures",
        200, _DOMAIN_VIEW, 404, 422), "parameters": _DAYS})}
REQUEST_PATHS["/providers"] = {
    "get": _id("getProviderFigures", {**_op(
        "SendDock's own attempts per receiving provider group and day: accepted, deferred, "
        "bounced, complained, with the complaint rate", 200, _PROVIDERS, 422),
        "parameters": _DAYS})}
REQUEST_PATHS["/warmups"] = {
    "get": _id("listWarmups", _op("Every sending domain in warm-up, with today's caps and "
                                   "sends", 200, {"type": "object", "required": ["warmups"],
                                                 "properties": {"warmups": {
                                                     "type": "array", "items": _WARMUP}}}))}
REQUEST_PATHS["/domains/{domain}/warmup"] = {
    "parameters": _DOMAIN_PARAM,
    "get": _id("getWarmup", _op("The domain's warm-up today (404: not in warm-up)", 200,
                                _WARMUP, 404, 422)),
    "put": _id("putWarmup", _op(
        "Start the domain's warm-up today (a running one restarts from day 1); mail beyond "
        "the day's or the hour's cap waits, never fails", 200, _WARMUP, 400, 404, 422,
        request=_WARMUP_BODY)),
    "delete": _id("deleteWarmup", _op(
        "End the domain's warm-up: its mail is no longer capped", 200,
        {"type": "object", "required": ["domain", "stopped"],
         "properties": {"domain": {"type": "string"}, "stopped": {"type": "boolean"}}},
        404, 422)),
}

_BOUNCE_RULE = {"type": "object", "required": ["id", "pattern", "reason", "hits"],
                "properties": {
                    "id": _INT, "pattern": {"type": "string"},
                    "reason": {"type": "string", "enum": list(VOCABULARY)},
                    "note": {"type": "string"}, "created_by": {"type": "string"},
                    "created_at": {"type": "string", "format": "date-time"},
                    "hits": _INT,
                    "last_hit_at": {"type": ["string", "null"], "format": "date-time"}}}
REQUEST_PATHS["/bounce-rules"] = {
    "get": _id("listBounceRules", _op(
        "The corrections that decide how later bounces are read, longest pattern first "
        "(the order they are tried in)", 200,
        {"type": "object", "required": ["rules"],
         "properties": {"rules": {"type": "array", "items": _BOUNCE_RULE}}})),
    "post": _id("addBounceRule", _op(
        "Keep a rule: every later bounce or complaint whose text holds the pattern (case "
        "and spacing ignored) is read as the reason; one with the same pattern is "
        "replaced; audited", 201, _BOUNCE_RULE, 400, 413, 422, request=_request(
            ["pattern", "reason"], {
                "pattern": {"type": "string", "maxLength": bounce_rules.MAX_PATTERN,
                            "pattern": bounce_rules.VALID,
                            "description": "plain text, not a regular expression, with at "
                                           "least 3 characters other than white space"},
                "reason": {"type": "string", "enum": list(VOCABULARY)},
                "note": NOTE}))),
}
REQUEST_PATHS["/bounce-rules/{id}"] = {
    "parameters": ID_PARAM,
    "delete": {"operationId": "deleteBounceRule",
               "summary": "Delete a rule: later bounces are read by the reader alone",
               "responses": {"204": {"description": "deleted"},
                             **_errors(400, 401, 403, 404)}}}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "SendDock API", "version": "1", "description": (
            "Text anywhere in a request (path, query, body, the keys of its objects) must "
            "not contain a NUL character: PostgreSQL cannot store one (422 naming the "
            "field).")},
        "servers": [{"url": "/api/v1"}],
        "components": {"schemas": SCHEMAS, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": REQUEST_PATHS,
    }
