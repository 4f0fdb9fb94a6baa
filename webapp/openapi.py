"""The OpenAPI document served at ``/api/v1/openapi.json``: every endpoint with its shapes."""

from __future__ import annotations

from typing import Any

ERROR = {"$ref": "#/components/schemas/Error"}
COUNTS = {"type": "object", "properties": {s: {"type": "integer"} for s in (
    "pending", "sending", "retry", "sent", "failed", "bounced", "skipped", "cancelled")}}


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
ID_PARAM = [{"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}]
VERIFICATION = {"type": "object", "required": ["id", "status", "correlation_id", "flags"],
                "properties": {"id": {"type": "integer"}, "status": {"type": "string"},
                               "correlation_id": {"type": "string"},
                               "flags": {"type": "array", "items": {"type": "string"}},
                               "email": {"type": "string"}, "user_id": {"type": "string"},
                               "created_at": {"type": "string"},
                               "existing": {"type": "boolean"}, "reused": {"type": "boolean"}}}

PATHS: dict[str, Any] = {
    "/lists": {
        "get": _op("All lists", 200, {"type": "object", "required": ["lists"],
                                      "properties": {"lists": {"type": "array"}}}),
        "post": _op("Create a list", 201, {"type": "object", "required": ["id", "name"],
                                           "properties": {"id": {"type": "integer"},
                                                          "name": {"type": "string"}}},
                    400, 413, 422, request={"type": "object", "required": ["name"],
                                            "properties": {"name": {"type": "string"}}}),
    },
    "/lists/{id}/subscribers": {
        "parameters": ID_PARAM,
        "post": _op("Add or update subscribers", 200, {
            "type": "object", "required": ["added", "updated", "errors"],
            "properties": {"added": {"type": "integer"}, "updated": {"type": "integer"},
                           "errors": {"type": "array"}}}, 400, 404, 413, 422,
            request={"type": "object", "required": ["subscribers"], "properties": {
                "subscribers": {"type": "array", "items": {
                    "type": "object", "required": ["email"], "properties": {
                        "email": {"type": "string"}, "name": {"type": "string"},
                        "attributes": {"type": "object"}}}}}}),
    },
    "/campaigns": {
        "post": _op("Create a campaign (draft)", 201, CAMPAIGN, 400, 404, 413, 422, request={
            "type": "object", "required": ["name", "list_id", "subject"], "properties": {
                "name": {"type": "string"}, "list_id": {"type": "integer"},
                "subject": {"type": "string"}, "text": {"type": "string"},
                "html": {"type": "string"}, "from": {"type": "string"}}}),
    },
    "/campaigns/{id}": {"parameters": ID_PARAM,
                        "get": _op("A campaign with exact counts", 200, CAMPAIGN, 404)},
    **{f"/campaigns/{{id}}/{action}": {
        "parameters": ID_PARAM,
        "post": _op(f"{action.capitalize()} the campaign", 202, CAMPAIGN, 400, 404, 409, 422)}
       for action in ("send", "pause", "resume", "cancel")},
    "/jobs/{id}": {"parameters": ID_PARAM,
                   "get": _op("A delivery job with its attempts", 200, JOB, 404)},
    "/suppressions": {
        "get": {**_op("Suppressed addresses, newest first (or by address with q), keyset-paged",
                      200, {"type": "object", "required": ["suppressions", "next"],
                            "properties": {"suppressions": {"type": "array",
                                                            "items": SUPPRESSION},
                                           "next": {"type": ["string", "null"]}}}, 422),
                "parameters": [
                    {"name": n, "in": "query", "required": False, "schema": {"type": t},
                     "description": d} for n, t, d in (
                        ("email", "string", "exactly this address"),
                        ("q", "string", "addresses starting with this"),
                        ("reason", "string", "bounced, unsubscribed, complaint or manual"),
                        ("after", "string", "the previous page's next"),
                        ("limit", "integer", "1 to 1000 (default 50)"))]},
        "post": _also(_op("Suppress an address (200 with created=false if it already is)",
                          201, SUPPRESSION_ADDED, 400, 413, 422, request={
                              "type": "object", "required": ["email"], "properties": {
                                  "email": {"type": "string"},
                                  "reason": {"type": "string", "enum": [
                                      "manual", "bounced", "unsubscribed", "complaint"]},
                                  "note": {"type": "string"}}}),
                      200, "already suppressed: nothing changed", SUPPRESSION_ADDED),
    },
    "/suppressions/{email}": {
        "parameters": [{"name": "email", "in": "path", "required": True,
                        "schema": {"type": "string"}},
                       {"name": "note", "in": "query", "required": False,
                        "schema": {"type": "string"}, "description": "why (audit log)"}],
        "delete": {"summary": "Clear the address: the next campaign includes it again",
                   "responses": {"204": {"description": "cleared"},
                                 **_errors(401, 403, 404, 422)}},
    },
    "/verifications": {"post": _op(
        "Enqueue a verification email (202 at once; an Idempotency-Key header or a live job "
        "for the same user returns that job with existing=true)", 202, VERIFICATION,
        400, 409, 413, 422, 503, request={
            "type": "object", "required": ["user_id", "email", "verify_url"], "properties": {
                "user_id": {"type": ["string", "integer"]}, "email": {"type": "string"},
                "verify_url": {"type": "string", "format": "uri"}}})},
    "/verifications/resend": {"post": _op(
        "Resend the user's verification email (429 + Retry-After inside the cooldown; a "
        "still-waiting job is reused, reused=true)", 202, VERIFICATION,
        400, 404, 409, 422, 429, 503, request={
            "type": "object", "required": ["user_id"],
            "properties": {"user_id": {"type": ["string", "integer"]}}})},
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
            "sample_data": {"type": "object"}, "sample_event": {"type": "object"}}}
KIND_BODY = {"type": "object", "properties": {
    k: v for k, v in KIND["properties"].items()
    if k not in ("name", "builtin", "version", "priority")}, "example": KIND_EXAMPLE}
EVENT = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string"}, "id": {"type": ["string", "integer"]},
    "at": {"type": "string", "format": "date-time"}},
    "additionalProperties": True, "description": "what caused the message (at most 64 KB)"}
MESSAGE = {"type": "object", "required": ["id", "status", "kind", "correlation_id", "flags"],
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
MESSAGE_BODY = {"type": "object", "required": ["kind", "user_id", "email"], "properties": {
    "kind": {"type": "string"}, "user_id": {"type": ["string", "integer"]},
    "email": {"type": "string"},
    "data": {"type": "object", "description": "what the template sees as data (≤ 64 KB)"},
    "event": EVENT,
    "send_at": {"type": "string", "format": "date-time",
                "description": "schedule it: not in the past, at most a year ahead"}},
    "example": {"kind": "onboarding", "user_id": "u-42", "email": "ada@example.com",
                "data": {"first_name": "Ada", "setup_url": "https://app.example/setup"},
                "event": {"name": "signup", "id": "evt_9f2", "at": "2026-12-01T09:00:00Z"},
                "send_at": "2026-12-04T09:00:00Z"}}
IDEMPOTENCY = [{"name": "Idempotency-Key", "in": "header", "required": False,
                "schema": {"type": "string", "maxLength": 255},
                "description": "the same key returns the same message, whatever its state"}]
PATHS["/kinds"] = {"get": _op("Every transactional kind", 200, {
    "type": "object", "required": ["kinds"],
    "properties": {"kinds": {"type": "array", "items": KIND}}})}
PATHS["/kinds/{name}"] = {
    "parameters": [{"name": "name", "in": "path", "required": True,
                    "schema": {"type": "string"}}],
    "get": _op("One kind", 200, KIND, 404, 422),
    "put": _also(_op("Create (201) or edit (200) a kind; fields left out keep their value "
                     "(a new kind's: its class's defaults). Template errors answer 422 with "
                     "the template and line", 201, KIND, 400, 413, 422, request=KIND_BODY),
                 200, "edited", KIND)}
PATHS["/messages"] = {
    "post": {**_op("Enqueue a message of a kind (202 at once). One message per user, kind "
                   "and dedupe window: asking again inside it returns that message with "
                   "existing=true; unknown kind: 404 listing the known kinds", 202, MESSAGE,
                   400, 404, 409, 413, 422, 503, request=MESSAGE_BODY),
             "parameters": IDEMPOTENCY},
    "delete": {**_op("Cancel the user's messages of the kind that are still waiting (the "
                     "user did the thing); answers how many", 200, {
                         "type": "object", "required": ["cancelled", "ids", "in_flight"],
                         "properties": {"kind": {"type": "string"},
                                        "user_id": {"type": "string"},
                                        "cancelled": {"type": "integer"},
                                        "ids": {"type": "array", "items": {"type": "integer"}},
                                        "in_flight": {"type": "integer"}}}, 404, 422),
               "parameters": [{"name": n, "in": "query", "required": True,
                               "schema": {"type": "string"}} for n in ("kind", "user_id")]}}
PATHS["/messages/resend"] = {"post": _op(
    "Resend the user's latest message of the kind (429 + Retry-After inside the kind's "
    "cooldown; a still-waiting one is reused, reused=true)", 202, MESSAGE,
    400, 404, 409, 422, 429, 503, request={
        "type": "object", "required": ["kind", "user_id"],
        "properties": {"kind": {"type": "string"},
                       "user_id": {"type": ["string", "integer"]}}})}

PATHS["/campaigns/{id}/send"]["post"]["requestBody"] = {
    "required": False, "description": "optional: schedule for a later time instead of now",
    **_json({"type": "object", "properties": {
        "at": {"type": "string", "format": "date-time",
               "description": "ISO 8601 with a zone, e.g. 2026-12-01T09:00:00Z"}}})}
PATHS["/openapi.json"] = {"get": {
    "summary": "This document (public: no token needed)", "security": [],
    "responses": {"200": {"description": "the OpenAPI document",
                          **_json({"type": "object", "required": ["openapi", "paths"]})}}}}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "fields"],
        "properties": {"message": {"type": "string"}, "fields": {"type": "object"}}}}},
    "Campaign": {"type": "object",
                 "required": ["id", "status", "broadcast_id", "total", "counts"],
                 "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                "status": {"type": "string", "enum": [
                                    "draft", "scheduled", "sending", "paused", "cancelled",
                                    "sent"]},
                                "broadcast_id": {"type": ["integer", "null"]},
                                "total": {"type": "integer"}, "counts": COUNTS}},
    "Job": {"type": "object", "required": ["id", "status", "attempts"],
            "properties": {"id": {"type": "integer"}, "status": {"type": "string"},
                           "kind": {"type": "string"}, "email": {"type": "string"},
                           "correlation_id": {"type": "string"},
                           "event": {"type": ["object", "null"],
                                     "description": "what caused it (transactional kinds)"},
                           "data": {"type": ["object", "null"],
                                    "description": "what its template saw as data"},
                           "attempts": {"type": "array"}}},
}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "SendDock API", "version": "1"},
        "servers": [{"url": "/api/v1"}],
        "components": {"schemas": SCHEMAS, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": PATHS,
    }
