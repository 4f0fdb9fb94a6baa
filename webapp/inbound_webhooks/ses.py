"""Amazon SES through an SNS HTTPS subscription: the SNS signature (versions 1 and 2)
checked with ``cryptography`` against the signing certificate, fetched only over HTTPS from
an allow-listed SNS host and cached; the topic must be one of ours (a valid SNS signature
only proves the message came from *some* SNS topic). Subscription confirmations are
confirmed (docs/design.md §18)."""

from __future__ import annotations

import base64
import binascii
import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from webapp.inbound_webhooks.base import (
    CORRELATION_HEADER,
    Inbound,
    Provider,
    ProviderEvent,
    Refs,
    WebhookRejected,
    WebhookRequest,
    email_of,
    fresh,
    message_id_of,
    read_json,
    turned_off,
)
from workers.after_acceptance.reports import Feedback, bounce_class
from workers.core import outgoing

log = logging.getLogger("senddock.web")

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
    source = email_of(mail.get("source"))
    if source:
        refs.addresses.append(source)
    common = mail.get("commonHeaders") or {}
    mid = message_id_of(common.get("messageId")) if isinstance(common, dict) else None
    for header in mail.get("headers") or []:
        if not isinstance(header, dict):
            continue
        name = str(header.get("name", "")).lower()
        if name == "message-id" and not mid:
            mid = message_id_of(header.get("value"))
        elif name == CORRELATION_HEADER and isinstance(header.get("value"), str):
            refs.correlation_ids.append(header["value"].strip())
        elif name == "return-path":
            addr = email_of(header.get("value"))
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
            addr = email_of(rcpt.get("emailAddress")) if isinstance(rcpt, dict) else None
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
            addr = email_of(rcpt.get("emailAddress")) if isinstance(rcpt, dict) else None
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


def verify_ses(body: bytes, certificates: SnsCertificates, topics: frozenset[str],
               max_age: float) -> dict[str, Any]:
    """Authenticate an SNS POST for SES; returns the SNS message."""
    message = read_json(body)
    if not isinstance(message, dict):
        raise WebhookRejected(400, "an SNS message is a JSON object")
    if not topics:
        raise turned_off(Ses.setting, Ses.title)
    # The cheap checks first: a malformed message, one for another topic, or an old one,
    # costs no certificate fetch.
    sns_string_to_sign(message)
    if message.get("TopicArn") not in topics:
        raise WebhookRejected(403, "the SNS topic is not one of SENDDOCK_SES_TOPIC_ARNS")
    fresh(_sns_time(message.get("Timestamp")), max_age, "the SNS message")
    verify_sns(message, certificates)
    return message


def read_ses(message: dict[str, Any], certificates: SnsCertificates) -> Inbound:
    """A verified SNS message as events (or as a subscription to confirm)."""
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
    notification = read_json(str(message.get("Message", "")).encode())
    if not isinstance(notification, dict):
        raise WebhookRejected(400, "the SNS Message is not a JSON object")
    inbound.events, inbound.ignored = ses_events(notification)
    return inbound


def parse_ses(body: bytes, certificates: SnsCertificates, topics: frozenset[str],
              max_age: float) -> Inbound:
    """Authenticate an SNS POST for SES and read it."""
    return read_ses(verify_ses(body, certificates, topics, max_age), certificates)


class SnsClient:
    """What /webhooks/ses needs from the outside: the signing certificates and the
    subscription confirmation GET. Tests replace ``app.extensions["senddock.sns"]``."""

    def __init__(self, certificates: SnsCertificates | None = None) -> None:
        self.certificates = certificates or SnsCertificates()
        self.confirmed: list[str] = []

    def confirm(self, url: str) -> None:
        if not sns_url_allowed(url, self.certificates.host_pattern):
            raise WebhookRejected(403, "SubscribeURL is not an Amazon SNS URL")
        answer = outgoing.request("GET", url, self.certificates.guard)
        if answer.status != 200:
            raise OSError(answer.error)
        self.confirmed.append(url)


class Ses(Provider):
    name = "ses"
    title = "SES"
    setting = "SES_TOPIC_ARNS"

    @staticmethod
    def client(request: WebhookRequest) -> SnsClient:
        client: SnsClient | None = request.extensions.get("senddock.sns")
        if client is None:
            client = request.extensions["senddock.sns"] = SnsClient(
                SnsCertificates(guard=request.settings.guard(timeout=10)))
        return client

    def verify(self, request: WebhookRequest) -> str | None:
        message = verify_ses(request.body, self.client(request).certificates,
                             request.settings.ses_topic_arns, request.settings.webhook_max_age)
        return f"sns:{message.get('MessageId')}"

    def parse(self, request: WebhookRequest) -> Inbound:
        return read_ses(read_json(request.body), self.client(request).certificates)

    def respond(self, inbound: Inbound, request: WebhookRequest) -> dict[str, Any] | None:
        if inbound.confirm_url is None:
            return None
        try:
            self.client(request).confirm(inbound.confirm_url)
        except WebhookRejected:
            raise
        except outgoing.Refused as exc:
            raise WebhookRejected(403, f"could not confirm the subscription: {exc}") from None
        except Exception as exc:
            raise WebhookRejected(502, f"could not confirm the subscription: "
                                       f"{type(exc).__name__}") from None
        log.info("confirmed the SNS subscription (%s)", inbound.replay_key)
        return {"confirmed": True}
