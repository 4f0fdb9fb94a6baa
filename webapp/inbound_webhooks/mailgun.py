"""Mailgun: HMAC-SHA256 of ``timestamp + token`` with the webhook signing key. Its replay key
(timestamp + token) is consumed as soon as the signature checks out, since the body is not
signed (docs/design.md §18)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from webapp.inbound_webhooks.base import (
    Inbound,
    Provider,
    ProviderEvent,
    Refs,
    WebhookRejected,
    WebhookRequest,
    email_of,
    fresh_stamp,
    message_id_of,
    read_json,
    turned_off,
)
from workers.after_acceptance.reports import Feedback, bounce_class


def _octets(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def verify_mailgun(body: bytes, signing_key: str | None) -> tuple[dict[str, Any], str]:
    """Check a Mailgun webhook's signature (HMAC-SHA256 of timestamp + token). Returns the
    body and its replay key, built from what Mailgun signs — the timestamp and the token,
    not the body. The caller consumes that key at once, whatever becomes of the request
    (:func:`read_mailgun` may still refuse it): the signature does not cover the body, so
    a refused request's signature must not be usable again with another body."""
    if not signing_key:
        raise turned_off(Mailgun.setting, Mailgun.title)
    item = read_json(body)
    signature = item.get("signature") if isinstance(item, dict) else None
    if not isinstance(signature, dict):
        raise WebhookRejected(401, "the Mailgun signature object is missing")
    stamp, token, given = (str(signature.get(k, "")) for k in ("timestamp", "token",
                                                                "signature"))
    # Compared as bytes: the fields are anyone's text (non-ASCII, even lone surrogates from
    # a JSON escape), which compare_digest refuses to compare as str.
    expected = hmac.new(signing_key.encode(), _octets(stamp + token),
                        hashlib.sha256).hexdigest().encode()
    if not token or not hmac.compare_digest(expected, _octets(given.lower())):
        raise WebhookRejected(403, "the Mailgun signature does not match")
    key = "mailgun:" + hashlib.sha256(_octets(f"{stamp}|{token}")).hexdigest()
    return item, key


def read_mailgun(item: dict[str, Any], max_age: float) -> Inbound:
    """A verified Mailgun webhook (see :func:`verify_mailgun`, whose key it has consumed)
    read as events."""
    fresh_stamp(str(item["signature"].get("timestamp", "")), max_age, "the Mailgun timestamp")
    data = item.get("event-data")
    if not isinstance(data, dict) or not isinstance(data.get("event"), str):
        raise WebhookRejected(400, "the Mailgun body has no event-data")
    inbound = Inbound("mailgun", None)  # its key was consumed before reading
    event = _mailgun_event(data)
    if event is None:
        inbound.ignored = 1
    else:
        inbound.events.append(event)
    return inbound


def parse_mailgun(body: bytes, signing_key: str | None, max_age: float) -> Inbound:
    """Verify and read a Mailgun webhook in one go, its replay key on the result (for
    callers that consume it with the effects; the web route consumes it first)."""
    item, key = verify_mailgun(body, signing_key)
    inbound = read_mailgun(item, max_age)
    inbound.replay_key = key
    return inbound


def _mailgun_event(data: dict[str, Any]) -> ProviderEvent | None:
    name = data["event"]
    if name not in ("failed", "complained"):
        return None
    addr = email_of(data.get("recipient"))
    if not addr:
        raise WebhookRejected(400, f"the Mailgun {name} event has no recipient")
    refs = Refs()
    envelope = data.get("envelope") or {}
    sender = email_of(envelope.get("sender")) if isinstance(envelope, dict) else None
    if sender:
        refs.addresses.append(sender)
    message = data.get("message") or {}
    headers = message.get("headers") if isinstance(message, dict) else None
    mid = message_id_of(headers.get("message-id")) if isinstance(headers, dict) else None
    if mid:
        refs.message_ids.append(mid)
    variables = data.get("user-variables") or {}
    if isinstance(variables, dict) and isinstance(variables.get("senddock-correlation-id"),
                                                  str):
        refs.correlation_ids.append(variables["senddock-correlation-id"])
    event_id = str(data.get("id") or "") or None
    if name == "complained":
        return ProviderEvent(Feedback("complaint", addr, None, "complaint via Mailgun", None,
                                      mid, event_id), refs, data)
    status = data.get("delivery-status") or {}
    if not isinstance(status, dict):
        status = {}
    code = status.get("code")
    text = str(status.get("description") or status.get("message") or data.get("reason") or "")
    enhanced = status.get("enhanced-code")
    diagnostic = f"smtp; {code} {text}" if code else text
    if data.get("severity") == "permanent":
        kind, reason = bounce_class(str(enhanced) if enhanced else None, diagnostic)
    else:
        kind, reason = "soft", (f"{code} {text}" if code else text)
    return ProviderEvent(Feedback("bounce", addr, kind, (reason or "failed")[:1000],
                                  str(enhanced) if enhanced else None, mid, event_id),
                         refs, data)



class Mailgun(Provider):
    name = "mailgun"
    title = "Mailgun"
    setting = "MAILGUN_SIGNING_KEY"
    consume_before_parse = True

    def verify(self, request: WebhookRequest) -> str | None:
        return verify_mailgun(request.body, self.configured(request.settings))[1]

    def parse(self, request: WebhookRequest) -> Inbound:
        return read_mailgun(read_json(request.body), request.settings.webhook_max_age)
