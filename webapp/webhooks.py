"""Provider webhooks (docs/design.md §18): each request authenticated the way its provider
documents, then turned into :class:`~workers.after_acceptance.reports.Feedback` events with the
references that find the job (VERP bounce address, Message-ID, correlation ID).

- SES through SNS: the SNS signature (versions 1 and 2) checked with ``cryptography``
  against the signing certificate, fetched only over HTTPS from an allow-listed SNS host
  and cached; the topic must be one of ours (a valid SNS signature only proves the message
  came from *some* SNS topic). Subscription confirmations are handed back to be confirmed.
- SendGrid: the Signed Event Webhook, ECDSA P-256/SHA-256 over ``timestamp + body``.
- Postmark: HTTP basic auth (the credentials put in the webhook URL).
- Mailgun: HMAC-SHA256 of ``timestamp + token`` with the webhook signing key; its replay
  key (timestamp + token) is consumed as soon as the signature checks out, since the body
  is not signed.
- Generic: ``Authorization: Bearer <webhook token>`` (checked by the caller against the
  stored hashes), body ``{"type", "email", "message_id"?, "bounce"?, "reason"?}``.

Every failure is a :class:`WebhookRejected` with the HTTP status and a plain message; the
caller changes nothing in that case. Signed timestamps older than ``max_age`` are refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from workers.after_acceptance.reports import Feedback, bounce_class
from workers.core import outgoing

CORRELATION_HEADER = "x-senddock-correlation-id"


class WebhookRejected(Exception):
    """The request is refused as a whole: nothing may be changed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Refs:
    """What a provider tells us about the message an event concerns."""

    addresses: list[str] = field(default_factory=list)      # envelope senders (VERP)
    message_ids: list[str] = field(default_factory=list)    # "<...>" Message-IDs
    correlation_ids: list[str] = field(default_factory=list)


@dataclass
class ProviderEvent:
    feedback: Feedback
    refs: Refs
    raw: dict[str, Any]


@dataclass
class Inbound:
    """One authenticated webhook request: its events, the key that identifies the request
    itself (a replay of the same signed request has the same key), and for SNS the
    subscription URL to confirm."""

    source: str
    replay_key: str | None
    events: list[ProviderEvent] = field(default_factory=list)
    confirm_url: str | None = None
    ignored: int = 0  # events of kinds SendDock does not act on (deliveries, opens, ...)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise WebhookRejected(400, "the body is not valid JSON") from None


def _fresh(stamp: float, max_age: float, what: str) -> None:
    age = time.time() - stamp
    if age > max_age:
        raise WebhookRejected(400, f"{what} is too old ({int(age)} s; at most {int(max_age)} s)"
                                   " — a replay, or a clock far off")
    if age < -300:
        raise WebhookRejected(400, f"{what} is in the future")


def _message_id(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    return value if value.startswith("<") else f"<{value}>"


def _email(value: Any) -> str | None:
    if not isinstance(value, str) or "@" not in value:
        return None
    return value.strip().strip("<>").lower()


# --- SES via SNS -------------------------------------------------------------------------

# SNS signs with certificates served from sns.<region>.amazonaws.com (and .com.cn in China).
SNS_CERT_HOST = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
_SNS_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp",
                                 "Token", "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp",
                                "Token", "TopicArn", "Type"),
}


def sns_url_allowed(url: str, host_pattern: re.Pattern[str] = SNS_CERT_HOST) -> bool:
    """True only for an ``https://`` URL on an SNS host (no port, no user info) — the only
    places a signing certificate or a subscription confirmation may come from."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return (parts.scheme == "https" and parts.port in (None, 443) and not parts.username
            and bool(parts.hostname) and bool(host_pattern.match(parts.hostname or "")))


class SnsCertificates:
    """Signing certificates by URL: checked against the SNS host allow-list *before* any
    fetch, fetched over HTTPS through the SSRF guard (:mod:`workers.core.outgoing`) with
    certificate verification, cached in memory — failures too: a URL whose fetch failed is
    not fetched again for ``failure_ttl`` seconds, and once ``max_failures`` fetches failed
    within that time no new URL is fetched until the oldest failure expires, so anonymous
    POSTs naming ever new certificate URLs cannot make SendDock fetch without end.

    ``fetch`` is the certificate source (tests pass one that serves their own
    certificate); the allow-list applies whatever the source."""

    def __init__(self, fetch: Callable[[str], bytes] | None = None,
                 host_pattern: re.Pattern[str] = SNS_CERT_HOST, max_cached: int = 32,
                 guard: outgoing.Guard | None = None, failure_ttl: float = 600,
                 max_failures: int = 20) -> None:
        self._fetch = fetch or self._https_get
        self.host_pattern = host_pattern
        self.guard = guard or outgoing.Guard()
        self._cache: dict[str, x509.Certificate] = {}
        self._failed: dict[str, float] = {}  # URL -> when its fetch failed (monotonic)
        self._lock = threading.Lock()
        self.max_cached = max_cached
        self.failure_ttl = failure_ttl
        self.max_failures = max_failures
        self.fetches = 0

    def _https_get(self, url: str) -> bytes:
        answer = outgoing.request("GET", url, self.guard, max_bytes=65536)
        if answer.status != 200:
            raise OSError(answer.error or f"HTTP {answer.status}")
        return answer.body

    def _known_failure(self, url: str) -> bool:
        """True when ``url`` failed recently, or too many fetches failed lately (the
        caller must not fetch); drops expired failures."""
        now = time.monotonic()
        with self._lock:
            for old in [u for u, at in self._failed.items() if now - at > self.failure_ttl]:
                del self._failed[old]
            return url in self._failed or len(self._failed) >= self.max_failures

    def _remember_failure(self, url: str) -> None:
        with self._lock:
            self._failed[url] = time.monotonic()

    def get(self, url: str) -> x509.Certificate:
        if not sns_url_allowed(url, self.host_pattern) or not urlsplit(url).path.endswith(
                ".pem"):
            raise WebhookRejected(403, "SigningCertURL is not an Amazon SNS certificate URL")
        with self._lock:
            cert = self._cache.get(url)
        if cert is not None:
            return cert
        if self._known_failure(url):
            raise WebhookRejected(403, "the SNS signing certificate could not be fetched "
                                       "(recently failed; not fetched again yet)")
        try:
            self.fetches += 1
            cert = x509.load_pem_x509_certificate(self._fetch(url))
        except Exception as exc:  # network, TLS, guard or PEM trouble: not verifiable
            self._remember_failure(url)
            reason = str(exc) if isinstance(exc, outgoing.Refused) else type(exc).__name__
            raise WebhookRejected(403, f"the SNS signing certificate could not be fetched: "
                                       f"{reason}") from None
        now = datetime.now(UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            self._remember_failure(url)
            raise WebhookRejected(403, "the SNS signing certificate is expired")
        with self._lock:
            if len(self._cache) >= self.max_cached:
                self._cache.pop(next(iter(self._cache)))
            self._cache[url] = cert
        return cert


def sns_string_to_sign(message: dict[str, Any]) -> bytes:
    """The canonical string SNS signs: the type's fields in order, ``name\\nvalue\\n``,
    ``Subject`` only when present."""
    fields = _SNS_FIELDS.get(str(message.get("Type")))
    if fields is None:
        raise WebhookRejected(400, f"unknown SNS message type {message.get('Type')!r}")
    out = []
    for name in fields:
        if name not in message:
            if name == "Subject":
                continue
            raise WebhookRejected(400, f"the SNS message has no {name}")
        out.append(f"{name}\n{message[name]}\n")
    return "".join(out).encode()


def verify_sns(message: dict[str, Any], certificates: SnsCertificates) -> None:
    """Raise unless ``message`` carries a valid SNS signature (version 1: SHA1withRSA,
    version 2: SHA256withRSA) from an allow-listed certificate."""
    version = str(message.get("SignatureVersion", ""))
    algorithm: hashes.HashAlgorithm
    if version == "1":
        algorithm = hashes.SHA1()  # SNS SignatureVersion 1 is SHA1withRSA
    elif version == "2":
        algorithm = hashes.SHA256()
    else:
        raise WebhookRejected(400, f"unsupported SNS SignatureVersion {version!r}")
    try:
        signature = base64.b64decode(str(message.get("Signature", "")), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookRejected(403, "the SNS signature is not base64") from None
    payload = sns_string_to_sign(message)
    key = certificates.get(str(message.get("SigningCertURL", ""))).public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise WebhookRejected(403, "the SNS signing certificate has no RSA key")
    try:
        key.verify(signature, payload, padding.PKCS1v15(), algorithm)
    except InvalidSignature:
        raise WebhookRejected(403, "the SNS signature does not match") from None


def _sns_time(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise WebhookRejected(400, "the SNS Timestamp is not a date") from None


def _ses_refs(mail: dict[str, Any]) -> Refs:
    refs = Refs()
    source = _email(mail.get("source"))
    if source:
        refs.addresses.append(source)
    common = mail.get("commonHeaders") or {}
    mid = _message_id(common.get("messageId")) if isinstance(common, dict) else None
    for header in mail.get("headers") or []:
        if not isinstance(header, dict):
            continue
        name = str(header.get("name", "")).lower()
        if name == "message-id" and not mid:
            mid = _message_id(header.get("value"))
        elif name == CORRELATION_HEADER and isinstance(header.get("value"), str):
            refs.correlation_ids.append(header["value"].strip())
        elif name == "return-path":
            addr = _email(header.get("value"))
            if addr and addr not in refs.addresses:
                refs.addresses.append(addr)
    if mid:
        refs.message_ids.append(mid)
    return refs


def ses_events(notification: dict[str, Any]) -> tuple[list[ProviderEvent], int]:
    """SES's bounce/complaint notification (SNS ``Message``, or event publishing's
    ``eventType`` form) as events; deliveries and other types are ignored (counted)."""
    kind = notification.get("notificationType") or notification.get("eventType")
    mail = notification.get("mail")
    if not isinstance(mail, dict):
        raise WebhookRejected(400, "the SES notification has no mail object")
    refs = _ses_refs(mail)
    events: list[ProviderEvent] = []
    if kind == "Bounce":
        bounce = notification.get("bounce") or {}
        hard = bounce.get("bounceType") == "Permanent"
        feedback_id = str(bounce.get("feedbackId") or "")
        for rcpt in bounce.get("bouncedRecipients") or []:
            addr = _email(rcpt.get("emailAddress")) if isinstance(rcpt, dict) else None
            if not addr:
                raise WebhookRejected(400, "a bounced recipient has no emailAddress")
            reason = str(rcpt.get("diagnosticCode") or bounce.get("bounceSubType") or "")
            subtype = bounce.get("bounceSubType")
            if not hard:
                kind_ = "soft"
            elif subtype in ("NoEmail", "Suppressed", "OnAccountSuppressionList") or \
                    not rcpt.get("diagnosticCode"):
                kind_ = "hard"
            else:
                # SES's "Permanent" is its own call; keep P5: a policy block is not a dead
                # address even when SES files it as permanent.
                kind_ = bounce_class(rcpt.get("status"), rcpt.get("diagnosticCode"))[0]
            events.append(ProviderEvent(Feedback(
                "bounce", addr, kind_, (reason or "bounced")[:1000],
                rcpt.get("status"), refs.message_ids[0] if refs.message_ids else None,
                f"{feedback_id}:{addr}" if feedback_id else None), refs, notification))
        return events, 0
    if kind == "Complaint":
        complaint = notification.get("complaint") or {}
        feedback_id = str(complaint.get("feedbackId") or "")
        ftype = complaint.get("complaintFeedbackType") or "abuse"
        if ftype == "not-spam":
            return [], 1
        for rcpt in complaint.get("complainedRecipients") or []:
            addr = _email(rcpt.get("emailAddress")) if isinstance(rcpt, dict) else None
            if not addr:
                raise WebhookRejected(400, "a complained recipient has no emailAddress")
            events.append(ProviderEvent(Feedback(
                "complaint", addr, None, f"complaint ({ftype}) via SES", None,
                refs.message_ids[0] if refs.message_ids else None,
                f"{feedback_id}:{addr}" if feedback_id else None), refs, notification))
        return events, 0
    if isinstance(kind, str):
        return [], 1
    raise WebhookRejected(400, "the SES notification has no notificationType")


def parse_ses(body: bytes, certificates: SnsCertificates, topics: frozenset[str],
              max_age: float) -> Inbound:
    """Authenticate an SNS POST for SES and read it."""
    message = _json(body)
    if not isinstance(message, dict):
        raise WebhookRejected(400, "an SNS message is a JSON object")
    if not topics:
        raise WebhookRejected(403, "SENDDOCK_SES_TOPIC_ARNS is not set: SES webhooks are off")
    # The cheap checks first: a malformed message, one for another topic, or an old one,
    # costs no certificate fetch.
    sns_string_to_sign(message)
    if message.get("TopicArn") not in topics:
        raise WebhookRejected(403, "the SNS topic is not one of SENDDOCK_SES_TOPIC_ARNS")
    _fresh(_sns_time(message.get("Timestamp")), max_age, "the SNS message")
    verify_sns(message, certificates)
    inbound = Inbound("ses", f"sns:{message.get('MessageId')}")
    kind = message["Type"]
    if kind == "SubscriptionConfirmation":
        url = str(message.get("SubscribeURL", ""))
        if not sns_url_allowed(url, certificates.host_pattern):
            raise WebhookRejected(403, "SubscribeURL is not an Amazon SNS URL")
        inbound.confirm_url = url
        return inbound
    if kind == "UnsubscribeConfirmation":
        return inbound
    notification = _json(str(message.get("Message", "")).encode())
    if not isinstance(notification, dict):
        raise WebhookRejected(400, "the SNS Message is not a JSON object")
    inbound.events, inbound.ignored = ses_events(notification)
    return inbound


# --- SendGrid ----------------------------------------------------------------------------

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


def parse_sendgrid(body: bytes, headers: Any, public_key: ec.EllipticCurvePublicKey | None,
                   max_age: float) -> Inbound:
    """Authenticate a SendGrid Signed Event Webhook POST and read its events."""
    if public_key is None:
        raise WebhookRejected(403, "SENDDOCK_SENDGRID_WEBHOOK_KEY is not set: SendGrid "
                                   "webhooks are off")
    signature = headers.get("X-Twilio-Email-Event-Webhook-Signature", "")
    stamp = headers.get("X-Twilio-Email-Event-Webhook-Timestamp", "")
    if not signature or not stamp:
        raise WebhookRejected(401, "the SendGrid signature headers are missing")
    try:
        public_key.verify(base64.b64decode(signature), stamp.encode() + body,
                          ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, binascii.Error, ValueError):
        raise WebhookRejected(403, "the SendGrid signature does not match") from None
    try:
        _fresh(float(stamp), max_age, "the SendGrid timestamp")
    except ValueError:
        raise WebhookRejected(400, "the SendGrid timestamp is not a number") from None
    items = _json(body)
    if not isinstance(items, list):
        raise WebhookRejected(400, "a SendGrid event webhook body is a JSON array")
    # The replay key is what the signature covers (timestamp and body), not the
    # signature's text: base64 with junk characters ("!", "*", which b64decode skips) and
    # ECDSA's mirror signature (r, n - s) verify too, and must not make a new request.
    inbound = Inbound("sendgrid", "sendgrid:" + hashlib.sha256(
        stamp.encode() + b"|" + body).hexdigest())
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("event"), str):
            raise WebhookRejected(400, "every SendGrid event is an object with an event")
        event = _sendgrid_event(item)
        if event is None:
            inbound.ignored += 1
        else:
            inbound.events.append(event)
    return inbound


def _sendgrid_event(item: dict[str, Any]) -> ProviderEvent | None:
    addr = _email(item.get("email"))
    name = item["event"]
    if name not in ("bounce", "spamreport"):
        return None  # processed, delivered, deferred, dropped, open, click, ...
    if not addr:
        raise WebhookRejected(400, f"a SendGrid {name} event has no email")
    refs = Refs()
    mid = _message_id(item.get("smtp-id"))
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


# --- Postmark ----------------------------------------------------------------------------

_POSTMARK_HARD = frozenset({"HardBounce", "BadEmailAddress", "ManuallyDeactivated"})


def check_basic_auth(header: str | None, expected: str | None) -> None:
    """Raise unless the ``Authorization: Basic`` header carries ``expected``
    (``user:password``); compared in constant time."""
    if not expected:
        raise WebhookRejected(403, "SENDDOCK_POSTMARK_WEBHOOK_AUTH is not set: Postmark "
                                   "webhooks are off")
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
    item = _json(body)
    if not isinstance(item, dict) or not isinstance(item.get("RecordType"), str):
        raise WebhookRejected(400, "a Postmark webhook body is an object with a RecordType")
    record = item["RecordType"]
    event_id = str(item.get("ID") or "") or None
    inbound = Inbound("postmark", f"postmark:{record}:{event_id}" if event_id else None)
    if record not in ("Bounce", "SpamComplaint"):
        inbound.ignored = 1
        return inbound
    addr = _email(item.get("Email"))
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


# --- Mailgun -----------------------------------------------------------------------------

def verify_mailgun(body: bytes, signing_key: str | None) -> tuple[dict[str, Any], str]:
    """Check a Mailgun webhook's signature (HMAC-SHA256 of timestamp + token). Returns the
    body and its replay key, built from what Mailgun signs — the timestamp and the token,
    not the body. The caller consumes that key at once, whatever becomes of the request
    (:func:`read_mailgun` may still refuse it): the signature does not cover the body, so
    a refused request's signature must not be usable again with another body."""
    if not signing_key:
        raise WebhookRejected(403, "SENDDOCK_MAILGUN_SIGNING_KEY is not set: Mailgun "
                                   "webhooks are off")
    item = _json(body)
    signature = item.get("signature") if isinstance(item, dict) else None
    if not isinstance(signature, dict):
        raise WebhookRejected(401, "the Mailgun signature object is missing")
    stamp, token, given = (str(signature.get(k, "")) for k in ("timestamp", "token",
                                                                "signature"))
    expected = hmac.new(signing_key.encode(), (stamp + token).encode(),
                        hashlib.sha256).hexdigest()
    if not token or not hmac.compare_digest(expected, given.lower()):
        raise WebhookRejected(403, "the Mailgun signature does not match")
    key = "mailgun:" + hashlib.sha256(f"{stamp}|{token}".encode()).hexdigest()
    return item, key


def read_mailgun(item: dict[str, Any], max_age: float) -> Inbound:
    """A verified Mailgun webhook (see :func:`verify_mailgun`, whose key it has consumed)
    read as events."""
    stamp = str(item["signature"].get("timestamp", ""))
    try:
        _fresh(float(stamp), max_age, "the Mailgun timestamp")
    except ValueError:
        raise WebhookRejected(400, "the Mailgun timestamp is not a number") from None
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
    addr = _email(data.get("recipient"))
    if not addr:
        raise WebhookRejected(400, f"the Mailgun {name} event has no recipient")
    refs = Refs()
    envelope = data.get("envelope") or {}
    sender = _email(envelope.get("sender")) if isinstance(envelope, dict) else None
    if sender:
        refs.addresses.append(sender)
    message = data.get("message") or {}
    headers = message.get("headers") if isinstance(message, dict) else None
    mid = _message_id(headers.get("message-id")) if isinstance(headers, dict) else None
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


# --- generic -----------------------------------------------------------------------------

def parse_generic(body: bytes) -> tuple[Inbound, list[dict[str, str]]]:
    """The generic webhook body (docs/design.md §18). Returns the request and the offending fields
    (``[{"field", "error"}]``; non-empty means 422 and nothing done)."""
    item = _json(body)
    if not isinstance(item, dict):
        raise WebhookRejected(400, "the body is a JSON object")
    errors: list[dict[str, str]] = []
    kind = item.get("type")
    if kind not in ("bounce", "complaint"):
        errors.append({"field": "type", "error": "must be \"bounce\" or \"complaint\""})
    addr = _email(item.get("email"))
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
    message_id = _message_id(mid)
    if message_id:
        refs.message_ids.append(message_id)
    text = reason or ("complaint" if kind == "complaint" else f"{bounce} bounce")
    inbound.events.append(ProviderEvent(Feedback(
        str(kind), addr, bounce if kind == "bounce" else None, text[:1000], None, message_id,
        event_id), refs, item))
    return inbound, []
