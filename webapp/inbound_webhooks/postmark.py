"""Postmark: HTTP basic auth (the credentials put in the webhook URL). Postmark gives no
reference to our message, so an event is matched to the newest job sent to its address
(docs/design.md §18)."""

from __future__ import annotations

import base64
import binascii
import hmac

from webapp.inbound_webhooks.base import (
    Inbound,
    Provider,
    ProviderEvent,
    Refs,
    WebhookRejected,
    WebhookRequest,
    email_of,
    read_json,
    turned_off,
)
from workers.after_acceptance.reports import Feedback

_POSTMARK_HARD = frozenset({"HardBounce", "BadEmailAddress", "ManuallyDeactivated"})


def check_basic_auth(header: str | None, expected: str | None) -> None:
    """Raise unless the ``Authorization: Basic`` header carries ``expected``
    (``user:password``); compared in constant time."""
    if not expected:
        raise turned_off(Postmark.setting, Postmark.title)
    if not header or not header.lower().startswith("basic "):
        raise WebhookRejected(401, "basic authentication required")
    try:
        given = base64.b64decode(header.split(None, 1)[1], validate=True)
    except (binascii.Error, ValueError, IndexError):
        raise WebhookRejected(401, "malformed basic authentication") from None
    if not hmac.compare_digest(given, expected.encode()):
        raise WebhookRejected(401, "wrong webhook credentials")


def parse_postmark(body: bytes) -> Inbound:
    """A Postmark bounce or spam-complaint webhook (already authenticated) as events."""
    item = read_json(body)
    if not isinstance(item, dict) or not isinstance(item.get("RecordType"), str):
        raise WebhookRejected(400, "a Postmark webhook body is an object with a RecordType")
    record = item["RecordType"]
    event_id = str(item.get("ID") or "") or None
    inbound = Inbound("postmark", f"postmark:{record}:{event_id}" if event_id else None)
    if record not in ("Bounce", "SpamComplaint"):
        inbound.ignored = 1
        return inbound
    addr = email_of(item.get("Email"))
    if not addr:
        raise WebhookRejected(400, "the Postmark event has no Email")
    refs = Refs()
    metadata = item.get("Metadata") or {}
    if isinstance(metadata, dict):
        for key in ("senddock-correlation-id", "correlation_id"):
            if isinstance(metadata.get(key), str):
                refs.correlation_ids.append(metadata[key])
    kind_name = str(item.get("Type") or "")
    if record == "SpamComplaint" or kind_name == "SpamComplaint":
        feedback = Feedback("complaint", addr, None, "complaint via Postmark", None, None,
                            event_id)
    else:
        reason = str(item.get("Details") or item.get("Description") or kind_name)
        feedback = Feedback("bounce", addr, "hard" if kind_name in _POSTMARK_HARD else "soft",
                            reason[:1000], None, None, event_id)
    inbound.events.append(ProviderEvent(feedback, refs, item))
    return inbound



class Postmark(Provider):
    name = "postmark"
    title = "Postmark"
    setting = "POSTMARK_WEBHOOK_AUTH"
    match_newest_to_address = True

    def verify(self, request: WebhookRequest) -> str | None:
        check_basic_auth(request.headers.get("Authorization"), self.configured(request.settings))
        return None  # the replay key is the record's id, read by parse

    def parse(self, request: WebhookRequest) -> Inbound:
        return parse_postmark(request.body)
