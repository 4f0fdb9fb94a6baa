"""Provider webhook payloads in the shapes the providers document (SES notifications through
SNS, SendGrid's event webhook, Postmark's bounce and spam-complaint webhooks, Mailgun's
webhooks), and signers that sign them as the providers do, with the tests' own keys."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import secrets
import time
import uuid
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from webapp.inbound_webhooks import sns_string_to_sign

TOPIC = "arn:aws:sns:us-east-1:123456789012:senddock-ses-feedback"
CERT_URL = ("https://sns.us-east-1.amazonaws.com/"
            "SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem")


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class SnsSigner:
    """Signs SNS messages like Amazon SNS (SignatureVersion 1 or 2) with a key of our own;
    ``pem`` is the certificate a test's certificate source serves for ``CERT_URL``."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
        now = dt.datetime.now(dt.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(hours=1))
                .not_valid_after(now + dt.timedelta(days=1))
                .sign(self.key, hashes.SHA256()))
        self.pem = cert.public_bytes(serialization.Encoding.PEM)

    def sign(self, message: dict[str, Any], version: str = "2") -> dict[str, Any]:
        message = {**message, "SignatureVersion": version, "SigningCertURL":
                   message.get("SigningCertURL", CERT_URL)}
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
        signature = self.key.sign(sns_string_to_sign(message), padding.PKCS1v15(), algorithm)
        message["Signature"] = base64.b64encode(signature).decode()
        return message

    def notification(self, inner: dict[str, Any], **overrides: Any) -> dict[str, Any]:
        message = {"Type": "Notification", "MessageId": str(uuid.uuid4()), "TopicArn": TOPIC,
                   "Message": json.dumps(inner), "Timestamp": _now_iso(),
                   "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"}
        message.update(overrides)
        return self.sign(message)

    def subscription(self, subscribe_url: str | None = None) -> dict[str, Any]:
        token = secrets.token_hex(32)
        return self.sign({
            "Type": "SubscriptionConfirmation", "MessageId": str(uuid.uuid4()),
            "Token": token, "TopicArn": TOPIC,
            "Message": f"You have chosen to subscribe to the topic {TOPIC}.\nTo confirm the "
                       "subscription, visit the SubscribeURL included in this message.",
            "SubscribeURL": subscribe_url or (
                "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription"
                f"&TopicArn={TOPIC}&Token={token}"),
            "Timestamp": _now_iso()})


def ses_bounce(email: str, *, message_id: str | None = None, source: str = "news@example.com",
               bounce_type: str = "Permanent", sub_type: str = "General",
               status: str = "5.1.1",
               diagnostic: str | None = "smtp; 550 5.1.1 user unknown") -> dict[str, Any]:
    """A bounce notification as in SES's "Bounce notification with a DSN" example."""
    rcpt: dict[str, Any] = {"emailAddress": email, "action": "failed", "status": status}
    if diagnostic:
        rcpt["diagnosticCode"] = diagnostic
    mail: dict[str, Any] = {
        "timestamp": _now_iso(), "source": source,
        "sourceArn": "arn:aws:ses:us-east-1:123456789012:identity/example.com",
        "sourceIp": "127.0.3.0", "sendingAccountId": "123456789012",
        "messageId": "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000",
        "destination": [email]}
    if message_id:
        mail.update(headersTruncated=False,
                    headers=[{"name": "From", "value": source},
                             {"name": "To", "value": email},
                             {"name": "Message-ID", "value": message_id}],
                    commonHeaders={"from": [source], "to": [email], "messageId": message_id,
                                   "subject": "Hello"})
    return {"notificationType": "Bounce", "bounce": {
        "bounceType": bounce_type, "bounceSubType": sub_type,
        "bouncedRecipients": [rcpt], "timestamp": _now_iso(),
        "feedbackId": f"0000013{secrets.token_hex(6)}-{uuid.uuid4()}-000000",
        "reportingMTA": "dns; email.example.com", "remoteMtaIp": "127.0.2.0"}, "mail": mail}


def ses_complaint(email: str, *, message_id: str | None = None,
                  source: str = "news@example.com") -> dict[str, Any]:
    """A complaint notification as in SES's "Complaint notification with a feedback
    report" example."""
    bounce = ses_bounce(email, message_id=message_id, source=source)
    return {"notificationType": "Complaint", "complaint": {
        "userAgent": "AnyCompany Feedback Loop (V0.01)",
        "complainedRecipients": [{"emailAddress": email}],
        "complaintFeedbackType": "abuse", "arrivalDate": _now_iso(), "timestamp": _now_iso(),
        "feedbackId": f"000001378603177f-{uuid.uuid4()}-000000"}, "mail": bounce["mail"]}


class SendGridSigner:
    """Signs event webhook bodies like SendGrid's Signed Event Webhook (ECDSA P-256)."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        der = self.key.public_key().public_bytes(serialization.Encoding.DER,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
        self.public_key = base64.b64encode(der).decode()  # as SendGrid's settings show it

    def headers(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        stamp = str(timestamp if timestamp is not None else int(time.time()))
        signature = self.key.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        return {"X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
                "X-Twilio-Email-Event-Webhook-Timestamp": stamp,
                "Content-Type": "application/json"}


def sendgrid_events(email: str, message_id: str, *, event: str = "bounce",
                    **extra: Any) -> list[dict[str, Any]]:
    """A SendGrid event webhook body (a JSON array), with the documented fields."""
    item: dict[str, Any] = {
        "email": email, "timestamp": int(time.time()), "smtp-id": message_id,
        "event": event, "category": ["newsletter"],
        "sg_event_id": base64.urlsafe_b64encode(secrets.token_bytes(16)).decode(),
        "sg_message_id": f"{secrets.token_hex(11)}.filter0001.16648.5515E0B88.0"}
    if event == "bounce":
        item.update(reason="500 unknown recipient", status="5.0.0", type="bounce",
                    bounce_classification="Invalid Address")
    item.update(extra)
    return [{"email": "other@example.com", "timestamp": int(time.time()),
             "event": "delivered", "smtp-id": "<x@example.com>", "response": "250 OK",
             "sg_event_id": secrets.token_hex(8)}, item]


def postmark_bounce(email: str, *, kind: str = "HardBounce", type_code: int = 1,
                    correlation_id: str | None = None) -> dict[str, Any]:
    """Postmark's bounce webhook body (RecordType "Bounce")."""
    return {"RecordType": "Bounce", "ID": secrets.randbelow(10**15), "Type": kind,
            "TypeCode": type_code, "Name": "Hard bounce", "Tag": "newsletter",
            "MessageID": str(uuid.uuid4()),
            "Metadata": {"senddock-correlation-id": correlation_id} if correlation_id else {},
            "ServerID": 23, "MessageStream": "outbound",
            "Description": "The server was unable to deliver your message (ex: unknown user,"
                           " mailbox not found).",
            "Details": "smtp;550 5.1.1 The email account that you tried to reach does not "
                       "exist.", "Email": email, "From": "news@example.com",
            "BouncedAt": _now_iso(), "DumpAvailable": True, "Inactive": True,
            "CanActivate": True, "Subject": "Hello", "Content": ""}


def postmark_complaint(email: str, correlation_id: str | None = None) -> dict[str, Any]:
    body = postmark_bounce(email, kind="SpamComplaint", type_code=512,
                           correlation_id=correlation_id)
    body.update(RecordType="SpamComplaint", Name="Spam complaint",
                Description="The subscriber explicitly marked this message as spam.",
                Details="Test spam complaint details")
    return body


def mailgun_sign(key: str, timestamp: int | None = None) -> dict[str, str]:
    stamp = str(timestamp if timestamp is not None else int(time.time()))
    token = secrets.token_hex(25)
    signature = hmac.new(key.encode(), (stamp + token).encode(), hashlib.sha256).hexdigest()
    return {"timestamp": stamp, "token": token, "signature": signature}


def mailgun_event(key: str, email: str, message_id: str, *, event: str = "failed",
                  severity: str = "permanent", sender: str = "news@example.com",
                  code: int = 550, description: str = "5.1.1 The email account that you "
                  "tried to reach does not exist.") -> dict[str, Any]:
    """A Mailgun webhook body: ``signature`` plus ``event-data`` as Mailgun documents."""
    data: dict[str, Any] = {
        "id": base64.urlsafe_b64encode(secrets.token_bytes(16)).decode(),
        "timestamp": time.time(), "log-level": "error", "event": event,
        "recipient": email, "recipient-domain": email.split("@")[1],
        "envelope": {"sender": sender, "transport": "smtp", "targets": email},
        "message": {"headers": {"to": email, "message-id": message_id.strip("<>"),
                                "from": "news@example.com", "subject": "Hello"},
                    "attachments": [], "size": 111},
        "tags": [], "user-variables": {}, "flags": {"is-routed": False}}
    if event == "failed":
        data.update(severity=severity, reason="bounce" if severity == "permanent" else
                    "generic", **{"delivery-status": {
                        "attempt-no": 1, "code": code, "message": description,
                        "description": description, "mx-host": "mx.example.com",
                        "session-seconds": 0.1}})
    return {"signature": mailgun_sign(key), "event-data": data}
