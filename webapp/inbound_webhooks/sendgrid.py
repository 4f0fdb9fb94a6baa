"""SendGrid's Signed Event Webhook: ECDSA P-256/SHA-256 over ``timestamp + body``
(docs/design.md §18)."""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

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


def sendgrid_public_key(value: str) -> ec.EllipticCurvePublicKey:
    """The verification key as SendGrid shows it (base64 DER), or PEM."""
    try:
        if "BEGIN PUBLIC KEY" in value:
            key = serialization.load_pem_public_key(value.encode())
        else:
            key = serialization.load_der_public_key(base64.b64decode(value.strip()))
    except (ValueError, binascii.Error):
        raise ValueError("SENDDOCK_SENDGRID_WEBHOOK_KEY is not a public key (base64 DER or "
                         "PEM)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("SENDDOCK_SENDGRID_WEBHOOK_KEY is not an ECDSA public key")
    return key


def verify_sendgrid(body: bytes, headers: Any, public_key: ec.EllipticCurvePublicKey | None,
                    max_age: float) -> str:
    """Authenticate a SendGrid Signed Event Webhook POST; returns its replay key."""
    if public_key is None:
        raise turned_off(SendGrid.setting, SendGrid.title)
    signature = headers.get("X-Twilio-Email-Event-Webhook-Signature", "")
    stamp = headers.get("X-Twilio-Email-Event-Webhook-Timestamp", "")
    if not signature or not stamp:
        raise WebhookRejected(401, "the SendGrid signature headers are missing")
    try:
        public_key.verify(base64.b64decode(signature), stamp.encode() + body,
                          ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, binascii.Error, ValueError):
        raise WebhookRejected(403, "the SendGrid signature does not match") from None
    fresh_stamp(stamp, max_age, "the SendGrid timestamp")
    # The replay key is what the signature covers (timestamp and body), not the
    # signature's text: base64 with junk characters ("!", "*", which b64decode skips) and
    # ECDSA's mirror signature (r, n - s) verify too, and must not make a new request.
    return "sendgrid:" + hashlib.sha256(stamp.encode() + b"|" + body).hexdigest()


def read_sendgrid(body: bytes) -> Inbound:
    """A verified SendGrid POST's events (its replay key is set by the caller)."""
    items = read_json(body)
    if not isinstance(items, list):
        raise WebhookRejected(400, "a SendGrid event webhook body is a JSON array")
    inbound = Inbound("sendgrid", None)
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("event"), str):
            raise WebhookRejected(400, "every SendGrid event is an object with an event")
        event = _sendgrid_event(item)
        if event is None:
            inbound.ignored += 1
        else:
            inbound.events.append(event)
    return inbound


def parse_sendgrid(body: bytes, headers: Any, public_key: ec.EllipticCurvePublicKey | None,
                   max_age: float) -> Inbound:
    """Authenticate a SendGrid Signed Event Webhook POST and read its events."""
    key = verify_sendgrid(body, headers, public_key, max_age)
    inbound = read_sendgrid(body)
    inbound.replay_key = key
    return inbound


def _sendgrid_event(item: dict[str, Any]) -> ProviderEvent | None:
    addr = email_of(item.get("email"))
    name = item["event"]
    if name not in ("bounce", "spamreport"):
        return None  # processed, delivered, deferred, dropped, open, click, ...
    if not addr:
        raise WebhookRejected(400, f"a SendGrid {name} event has no email")
    refs = Refs()
    mid = message_id_of(item.get("smtp-id"))
    if mid:
        refs.message_ids.append(mid)
    if isinstance(item.get("senddock_correlation_id"), str):
        refs.correlation_ids.append(item["senddock_correlation_id"])
    event_id = str(item.get("sg_event_id") or "") or None
    if name == "spamreport":
        return ProviderEvent(Feedback("complaint", addr, None, "complaint via SendGrid",
                                      None, mid, event_id), refs, item)
    reason = str(item.get("reason") or "")
    status = str(item.get("status") or "") or None
    # type "blocked" is SendGrid's soft class; "bounce" is hard only if the reply says the
    # address is dead (P5).
    kind = "soft" if item.get("type") == "blocked" else bounce_class(status, reason)[0]
    return ProviderEvent(Feedback("bounce", addr, kind, (reason or "bounced")[:1000], status,
                                  mid, event_id), refs, item)



class SendGrid(Provider):
    name = "sendgrid"
    title = "SendGrid"
    setting = "SENDGRID_WEBHOOK_KEY"
    batch = True

    def verify(self, request: WebhookRequest) -> str | None:
        key = sendgrid_public_key(self.configured(request.settings))
        return verify_sendgrid(request.body, request.headers, key,
                               request.settings.webhook_max_age)

    def parse(self, request: WebhookRequest) -> Inbound:
        return read_sendgrid(request.body)
