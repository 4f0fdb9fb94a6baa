"""Any other source: ``Authorization: Bearer <webhook token>`` (checked against the stored
hashes), body ``{"type", "email", "message_id"?, "bounce"?, "reason"?, "id"?}``
(docs/design.md §18)."""

from __future__ import annotations

from webapp.domain import feedback_intake
from webapp.inbound_webhooks.base import (
    Inbound,
    Provider,
    ProviderEvent,
    Refs,
    WebhookRejected,
    WebhookRequest,
    email_of,
    message_id_of,
    read_json,
)
from workers.after_acceptance.reports import Feedback


def parse_generic(body: bytes) -> tuple[Inbound, list[dict[str, str]]]:
    """The generic webhook body (docs/design.md §18). Returns the request and the offending fields
    (``[{"field", "error"}]``; non-empty means 422 and nothing done)."""
    item = read_json(body)
    if not isinstance(item, dict):
        raise WebhookRejected(400, "the body is a JSON object")
    errors: list[dict[str, str]] = []
    kind = item.get("type")
    if kind not in ("bounce", "complaint"):
        errors.append({"field": "type", "error": "must be \"bounce\" or \"complaint\""})
    addr = email_of(item.get("email"))
    if not addr or len(addr) > 320:
        errors.append({"field": "email", "error": "must be an email address"})
    bounce = item.get("bounce", "hard" if kind == "bounce" else None)
    if kind == "bounce" and bounce not in ("hard", "soft"):
        errors.append({"field": "bounce", "error": "must be \"hard\" or \"soft\""})
    if kind == "complaint" and item.get("bounce") is not None:
        errors.append({"field": "bounce", "error": "only for a bounce"})
    mid = item.get("message_id")
    if mid is not None and (not isinstance(mid, str) or not mid.strip() or len(mid) > 998):
        errors.append({"field": "message_id", "error": "must be a Message-ID"})
    reason = item.get("reason", "")
    if not isinstance(reason, str):
        errors.append({"field": "reason", "error": "must be text"})
    event_id = item.get("id")
    if event_id is not None and not isinstance(event_id, str):
        errors.append({"field": "id", "error": "must be text"})
    inbound = Inbound("generic", None)
    if errors:
        return inbound, errors
    assert addr is not None
    refs = Refs()
    message_id = message_id_of(mid)
    if message_id:
        refs.message_ids.append(message_id)
    text = reason or ("complaint" if kind == "complaint" else f"{bounce} bounce")
    inbound.events.append(ProviderEvent(Feedback(
        str(kind), addr, bounce if kind == "bounce" else None, text[:1000], None, message_id,
        event_id), refs, item))
    return inbound, []



class Generic(Provider):
    name = "generic"
    title = "generic"
    address_events = True

    def verify(self, request: WebhookRequest) -> str | None:
        with request.connect() as conn:
            ok = feedback_intake.check_webhook_token(conn, request.headers.get("Authorization"))
        if not ok:
            raise WebhookRejected(401, "a valid webhook token is required "
                                       "(Authorization: Bearer <token from senddock "
                                       "webhook-token create>)")
        return None

    def parse(self, request: WebhookRequest) -> Inbound:
        inbound, errors = parse_generic(request.body)
        if errors:
            raise WebhookRejected(422, "the event is not valid",
                                  {e["field"]: e["error"] for e in errors})
        return inbound
