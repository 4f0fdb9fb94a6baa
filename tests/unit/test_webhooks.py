"""Provider webhook authentication and payloads, without a database: every provider's
documented shape is read, and a bad signature, a forged certificate URL, a stale or
tampered request is refused."""

from __future__ import annotations

import base64
import json
import time

import pytest

from tests import webhook_payloads as wp
from webapp import inbound_webhooks as wh

TOPICS = frozenset({wp.TOPIC})


@pytest.fixture()
def sns() -> wp.SnsSigner:
    return wp.SnsSigner()


def certs_for(signer: wp.SnsSigner) -> wh.SnsCertificates:
    served: list[str] = []

    def fetch(url: str) -> bytes:
        served.append(url)
        return signer.pem

    certificates = wh.SnsCertificates(fetch=fetch)
    certificates.served = served  # type: ignore[attr-defined]
    return certificates


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize("version", ["1", "2"])
def test_ses_bounce_through_sns_is_verified_and_read(sns: wp.SnsSigner, version: str) -> None:
    inner = wp.ses_bounce("Jane@Example.com", message_id="<5.abc@example.com>",
                          source="bounces+tok@example.com")
    message = sns.notification(inner)
    message = sns.sign({k: v for k, v in message.items() if k != "Signature"}, version)
    certificates = certs_for(sns)
    inbound = wh.parse_ses(body(message), certificates, TOPICS, 3600)
    [event] = inbound.events
    assert (event.feedback.type, event.feedback.email, event.feedback.bounce) == (
        "bounce", "jane@example.com", "hard")
    assert event.refs.message_ids == ["<5.abc@example.com>"]
    assert event.refs.addresses == ["bounces+tok@example.com"]
    assert inbound.replay_key == f"sns:{message['MessageId']}"
    # The certificate is fetched once and cached.
    wh.parse_ses(body(sns.notification(inner)), certificates, TOPICS, 3600)
    assert certificates.fetches == 1


def test_ses_complaint_and_transient_bounce(sns: wp.SnsSigner) -> None:
    certificates = certs_for(sns)
    inbound = wh.parse_ses(body(sns.notification(wp.ses_complaint("a@example.com"))),
                           certificates, TOPICS, 3600)
    assert [(e.feedback.type, e.feedback.email) for e in inbound.events] == [
        ("complaint", "a@example.com")]
    soft = wp.ses_bounce("b@example.com", bounce_type="Transient", sub_type="MailboxFull",
                         status="4.2.2", diagnostic="smtp; 452 4.2.2 mailbox full")
    inbound = wh.parse_ses(body(sns.notification(soft)), certificates, TOPICS, 3600)
    assert inbound.events[0].feedback.bounce == "soft"
    policy = wp.ses_bounce("c@example.com", diagnostic="smtp; 554 5.7.1 blocked by policy",
                           status="5.7.1")
    inbound = wh.parse_ses(body(sns.notification(policy)), certificates, TOPICS, 3600)
    assert inbound.events[0].feedback.bounce == "soft"  # P5: policy is not a dead address
    delivery = {"notificationType": "Delivery", "mail": {"source": "x@example.com"},
                "delivery": {"recipients": ["d@example.com"]}}
    inbound = wh.parse_ses(body(sns.notification(delivery)), certificates, TOPICS, 3600)
    assert (inbound.events, inbound.ignored) == ([], 1)


def test_subscription_confirmation_is_handed_back(sns: wp.SnsSigner) -> None:
    message = sns.subscription()
    inbound = wh.parse_ses(body(message), certs_for(sns), TOPICS, 3600)
    assert inbound.confirm_url == message["SubscribeURL"]
    evil = sns.subscription("https://evil.example.com/confirm")
    with pytest.raises(wh.WebhookRejected) as err:
        wh.parse_ses(body(evil), certs_for(sns), TOPICS, 3600)
    assert err.value.status == 403


def test_tampered_sns_message_is_refused(sns: wp.SnsSigner) -> None:
    message = sns.notification(wp.ses_bounce("a@example.com"))
    message["Message"] = json.dumps(wp.ses_bounce("victim@example.com"))
    with pytest.raises(wh.WebhookRejected) as err:
        wh.parse_ses(body(message), certs_for(sns), TOPICS, 3600)
    assert (err.value.status, err.value.message) == (403, "the SNS signature does not match")


def test_a_certificate_of_another_key_is_refused(sns: wp.SnsSigner) -> None:
    other = wp.SnsSigner()
    message = sns.notification(wp.ses_bounce("a@example.com"))
    with pytest.raises(wh.WebhookRejected):
        wh.parse_ses(body(message), certs_for(other), TOPICS, 3600)


@pytest.mark.parametrize("url", [
    "http://sns.us-east-1.amazonaws.com/x.pem",                # not HTTPS
    "https://sns.us-east-1.amazonaws.com.evil.example/x.pem",  # lookalike host
    "https://evil.example/sns.us-east-1.amazonaws.com/x.pem",
    "https://user@sns.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com:8443/x.pem",
    "https://sns.us-east-1.amazonaws.com/x.txt",
])
def test_certificate_urls_off_the_allow_list_are_never_fetched(sns: wp.SnsSigner,
                                                               url: str) -> None:
    certificates = certs_for(sns)
    message = sns.notification(wp.ses_bounce("a@example.com"), SigningCertURL=url)
    with pytest.raises(wh.WebhookRejected) as err:
        wh.parse_ses(body(message), certificates, TOPICS, 3600)
    assert err.value.status == 403
    assert certificates.served == []  # type: ignore[attr-defined]


def test_other_topics_stale_messages_and_no_topic_setting(sns: wp.SnsSigner) -> None:
    other_topic = sns.notification(wp.ses_bounce("a@example.com"),
                                   TopicArn="arn:aws:sns:us-east-1:999999999999:theirs")
    with pytest.raises(wh.WebhookRejected, match="not one of"):
        wh.parse_ses(body(other_topic), certs_for(sns), TOPICS, 3600)
    stale = sns.notification(wp.ses_bounce("a@example.com"),
                             Timestamp="2020-01-01T00:00:00.000Z")
    with pytest.raises(wh.WebhookRejected, match="too old"):
        wh.parse_ses(body(stale), certs_for(sns), TOPICS, 3600)
    with pytest.raises(wh.WebhookRejected, match="SES_TOPIC_ARNS"):
        wh.parse_ses(body(stale), certs_for(sns), frozenset(), 3600)
    for bad in (b"not json", b"[]", body({"Type": "Nope"})):
        with pytest.raises(wh.WebhookRejected):
            wh.parse_ses(bad, certs_for(sns), TOPICS, 3600)


def test_sendgrid_signed_events() -> None:
    signer = wp.SendGridSigner()
    key = wh.sendgrid_public_key(signer.public_key)
    raw = body(wp.sendgrid_events("Gone@Example.com", "<7.x@example.com>"))
    inbound = wh.parse_sendgrid(raw, signer.headers(raw), key, 3600)
    assert inbound.ignored == 1  # the "delivered" event
    [event] = inbound.events
    assert (event.feedback.email, event.feedback.bounce) == ("gone@example.com", "hard")
    assert event.refs.message_ids == ["<7.x@example.com>"]
    spam = body(wp.sendgrid_events("s@example.com", "<8.x@example.com>", event="spamreport"))
    inbound = wh.parse_sendgrid(spam, signer.headers(spam), key, 3600)
    assert inbound.events[0].feedback.type == "complaint"
    blocked = body(wp.sendgrid_events("b@example.com", "<9.x@example.com>", type="blocked",
                                      reason="550 5.7.1 spam", status="5.7.1"))
    inbound = wh.parse_sendgrid(blocked, signer.headers(blocked), key, 3600)
    assert inbound.events[0].feedback.bounce == "soft"


def test_sendgrid_refusals() -> None:
    signer = wp.SendGridSigner()
    key = wh.sendgrid_public_key(signer.public_key)
    raw = body(wp.sendgrid_events("a@example.com", "<1@example.com>"))
    headers = signer.headers(raw)
    with pytest.raises(wh.WebhookRejected) as err:
        wh.parse_sendgrid(raw + b" ", headers, key, 3600)
    assert err.value.status == 403
    with pytest.raises(wh.WebhookRejected) as err:
        wh.parse_sendgrid(raw, {}, key, 3600)
    assert err.value.status == 401
    old = signer.headers(raw, timestamp=int(time.time()) - 7200)
    with pytest.raises(wh.WebhookRejected, match="too old"):
        wh.parse_sendgrid(raw, old, key, 3600)
    other = wh.sendgrid_public_key(wp.SendGridSigner().public_key)
    with pytest.raises(wh.WebhookRejected):
        wh.parse_sendgrid(raw, headers, other, 3600)
    with pytest.raises(wh.WebhookRejected, match="not set"):
        wh.parse_sendgrid(raw, headers, None, 3600)
    obj = b'{"event": "bounce"}'
    with pytest.raises(wh.WebhookRejected, match="JSON array"):
        wh.parse_sendgrid(obj, signer.headers(obj), key, 3600)


def test_postmark_basic_auth_and_payloads() -> None:
    good = "Basic " + base64.b64encode(b"senddock:s3cret").decode()
    wh.check_basic_auth(good, "senddock:s3cret")
    for header, status in ((None, 401), ("Bearer x", 401), ("Basic !!!", 401),
                           ("Basic " + base64.b64encode(b"senddock:wrong").decode(), 401)):
        with pytest.raises(wh.WebhookRejected) as err:
            wh.check_basic_auth(header, "senddock:s3cret")
        assert err.value.status == status
    with pytest.raises(wh.WebhookRejected) as err:
        wh.check_basic_auth(good, None)
    assert err.value.status == 403
    inbound = wh.parse_postmark(body(wp.postmark_bounce("H@example.com", correlation_id="c1")))
    [event] = inbound.events
    assert (event.feedback.email, event.feedback.bounce, event.refs.correlation_ids) == (
        "h@example.com", "hard", ["c1"])
    soft = wh.parse_postmark(body(wp.postmark_bounce("s@example.com", kind="SoftBounce",
                                                     type_code=4096)))
    assert soft.events[0].feedback.bounce == "soft"
    spam = wh.parse_postmark(body(wp.postmark_complaint("c@example.com")))
    assert spam.events[0].feedback.type == "complaint"
    delivery = wh.parse_postmark(b'{"RecordType": "Delivery", "Recipient": "a@b.c"}')
    assert (delivery.events, delivery.ignored) == ([], 1)
    with pytest.raises(wh.WebhookRejected):
        wh.parse_postmark(b'{"RecordType": "Bounce"}')


def test_mailgun_hmac_and_payloads() -> None:
    key = "key-mailgun-signing"
    raw = body(wp.mailgun_event(key, "G@example.com", "<3.x@example.com>",
                                sender="bounces+t@example.com"))
    inbound = wh.parse_mailgun(raw, key, 3600)
    [event] = inbound.events
    assert (event.feedback.email, event.feedback.bounce) == ("g@example.com", "hard")
    assert event.refs.message_ids == ["<3.x@example.com>"]
    assert event.refs.addresses == ["bounces+t@example.com"]
    temp = wh.parse_mailgun(body(wp.mailgun_event(key, "t@example.com", "<4@x>",
                                                  severity="temporary", code=452,
                                                  description="mailbox full")), key, 3600)
    assert temp.events[0].feedback.bounce == "soft"
    complaint = wh.parse_mailgun(body(wp.mailgun_event(key, "c@example.com", "<5@x>",
                                                       event="complained")), key, 3600)
    assert complaint.events[0].feedback.type == "complaint"
    forged = wp.mailgun_event("another-key", "a@example.com", "<6@x>")
    with pytest.raises(wh.WebhookRejected) as err:
        wh.parse_mailgun(body(forged), key, 3600)
    assert err.value.status == 403
    stale = wp.mailgun_event(key, "a@example.com", "<6@x>")
    stale["signature"] = wp.mailgun_sign(key, int(time.time()) - 7200)
    with pytest.raises(wh.WebhookRejected, match="too old"):
        wh.parse_mailgun(body(stale), key, 3600)
    with pytest.raises(wh.WebhookRejected, match="not set"):
        wh.parse_mailgun(raw, None, 3600)


def test_generic_body_validation() -> None:
    inbound, errors = wh.parse_generic(b'{"type": "bounce", "email": "A@Example.com", '
                                       b'"message_id": "1.x@example.com", "reason": "gone"}')
    assert errors == []
    [event] = inbound.events
    assert (event.feedback.email, event.feedback.bounce, event.refs.message_ids) == (
        "a@example.com", "hard", ["<1.x@example.com>"])
    _, errors = wh.parse_generic(b'{"type": "nope", "email": "x", "bounce": "maybe"}')
    assert {e["field"] for e in errors} == {"type", "email"}
    _, errors = wh.parse_generic(b'{"type": "bounce", "email": "a@b.c", "bounce": "maybe"}')
    assert [e["field"] for e in errors] == ["bounce"]
    with pytest.raises(wh.WebhookRejected):
        wh.parse_generic(b"[1, 2]")


def test_every_registered_provider_may_be_stored_as_a_source() -> None:
    # job_events.source has a CHECK built from FEEDBACK_SOURCES: a provider whose name is
    # not there would fail at its first event, so a new provider widens it (a migration).
    from webapp.inbound_webhooks import registry
    from webapp.models import FEEDBACK_SOURCES

    assert set(registry.names()) <= set(FEEDBACK_SOURCES)
    for provider in registry.PROVIDERS.values():
        assert provider.name and provider.title
