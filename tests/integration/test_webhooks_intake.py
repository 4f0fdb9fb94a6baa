"""Provider webhooks end to end through the app (real PostgreSQL): each provider's
documented payload moves the job, the suppression list and the campaign counts; bad
signatures, replays, unknown messages and malformed bodies get a clear 4xx and change
nothing (asserted on the database)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests import webhook_payloads as wp
from tests.conftest import settings
from tests.helpers import accepted_campaign, make_campaign, place_jobs
from webapp import create_app
from webapp.domain import feedback_intake
from webapp.inbound_webhooks import SnsCertificates, SnsClient, registry
from workers import queue
from workers.building.links import bounce_address
from workers.core.settings import load

SECRET = "test-secret-key-not-for-production"
MAILGUN_KEY = "mailgun-signing-key"


@pytest.fixture()
def signers() -> dict[str, Any]:
    return {"sns": wp.SnsSigner(), "sendgrid": wp.SendGridSigner()}


@pytest.fixture()
def hook_app(engine: sa.Engine, db_url: str, signers: dict[str, Any]) -> Any:
    config = load(settings(db_url, SES_TOPIC_ARNS=wp.TOPIC,
                           SENDGRID_WEBHOOK_KEY=signers["sendgrid"].public_key,
                           POSTMARK_WEBHOOK_AUTH="senddock:pm-secret",
                           MAILGUN_SIGNING_KEY=MAILGUN_KEY,
                           BOUNCE_ADDRESS="bounces@example.com", SOFT_BOUNCE_LIMIT="3",
                           COMPLAINT_MIN_DELIVERED="100"))
    app = create_app(config, engine=engine)
    app.config["TESTING"] = True
    pem = signers["sns"].pem
    client = SnsClient(SnsCertificates(fetch=lambda url: pem))
    client.confirm = client.confirmed.append  # type: ignore[method-assign]
    app.extensions["senddock.sns"] = client
    return app


@pytest.fixture()
def hc(hook_app: Any) -> Any:
    return hook_app.test_client()


def sent_campaign(engine: sa.Engine, emails: list[str]) -> dict[str, Any]:
    """A campaign whose jobs the relay accepted (sent, with their Message-IDs)."""
    return accepted_campaign(engine, emails)[0]


def jobs(engine: sa.Engine, broadcast_id: int) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        return {r["email"]: dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM delivery_jobs WHERE broadcast_id = :b"), {"b": broadcast_id}
        ).mappings()}


def snapshot(engine: sa.Engine) -> tuple[Any, ...]:
    """Everything a webhook may change: a refused request must leave it as it was."""
    with engine.connect() as conn:
        return tuple(conn.execute(sa.text(q)).all() for q in (
            "SELECT id, status, last_error FROM delivery_jobs ORDER BY id",
            "SELECT email, reason, reply FROM suppressions ORDER BY email",
            "SELECT count(*) FROM job_events", "SELECT status, sum(n) FROM broadcast_counts "
            "GROUP BY status ORDER BY status", "SELECT id, status FROM campaigns ORDER BY id"))


def assert_exact_counts(engine: sa.Engine, broadcast_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        fast = queue.broadcast_counts(conn, broadcast_id)
        assert fast == queue.broadcast_counts_slow(conn, broadcast_id)  # P8
    return fast


def post_sns(hc: Any, message: dict[str, Any]) -> Any:
    return hc.post("/webhooks/ses", data=json.dumps(message),
                   headers={"x-amz-sns-message-type": message["Type"],
                            "Content-Type": "text/plain; charset=UTF-8"})


def test_ses_hard_bounce_moves_the_job_and_suppresses(hc: Any, engine: sa.Engine,
                                                       signers: dict[str, Any]) -> None:
    campaign = sent_campaign(engine, ["jane@example.com", "john@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["jane@example.com"]
    inner = wp.ses_bounce("jane@example.com", message_id=job["message_id"],
                          diagnostic="smtp; 550 5.1.1 <jane@example.com>... User unknown")
    message = signers["sns"].notification(inner)
    answer = post_sns(hc, message)
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["effects"] == {"bounced": 1}
    after = jobs(engine, campaign["broadcast_id"])
    assert after["jane@example.com"]["status"] == "bounced"
    assert after["john@example.com"]["status"] == "sent"
    assert assert_exact_counts(engine, campaign["broadcast_id"])["bounced"] == 1
    with engine.connect() as conn:
        sup = conn.execute(sa.text("SELECT reason, reply, job_id FROM suppressions")).one()
        event = conn.execute(sa.text("SELECT source, type, bounce, raw, job_id "
                                     "FROM job_events")).one()
    assert (sup.reason, sup.job_id) == ("bounced", job["id"]) and "User unknown" in sup.reply
    assert (event.source, event.type, event.bounce, event.job_id) == ("ses", "bounce", "hard",
                                                                      job["id"])
    assert json.loads(event.raw)["bounce"]["bounceType"] == "Permanent"

    # The same request again (a replay): 409, nothing changes.
    before = snapshot(engine)
    again = post_sns(hc, message)
    assert again.status_code == 409
    assert "already processed" in again.get_json()["error"]["message"]
    assert snapshot(engine) == before


def test_refused_sns_requests_change_nothing(hc: Any, engine: sa.Engine,
                                             signers: dict[str, Any]) -> None:
    campaign = sent_campaign(engine, ["a@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["a@example.com"]
    sns = signers["sns"]
    good = sns.notification(wp.ses_bounce("a@example.com", message_id=job["message_id"]))
    tampered = {**good, "Message": json.dumps(wp.ses_bounce("a@example.com",
                                                            message_id="<other@x>"))}
    foreign = sns.notification(wp.ses_bounce("a@example.com", message_id="<nope@example.com>"))
    wrong_topic = sns.notification(wp.ses_bounce("a@example.com", message_id=job["message_id"]),
                                   TopicArn="arn:aws:sns:us-east-1:1:theirs")
    evil_cert = sns.notification(wp.ses_bounce("a@example.com", message_id=job["message_id"]),
                                 SigningCertURL="https://evil.example/cert.pem")
    before = snapshot(engine)
    for message, status in ((tampered, 403), (foreign, 404), (wrong_topic, 403),
                            (evil_cert, 403)):
        answer = post_sns(hc, message)
        assert answer.status_code == status, (status, answer.get_json())
        assert answer.get_json()["error"]["message"]
    for raw in (b"{not json", b"[]", b'{"Type": "Notification"}'):
        assert hc.post("/webhooks/ses", data=raw).status_code == 400
    assert snapshot(engine) == before


def test_sns_subscription_is_confirmed(hc: Any, hook_app: Any,
                                       signers: dict[str, Any]) -> None:
    message = signers["sns"].subscription()
    answer = post_sns(hc, message)
    assert answer.status_code == 200 and answer.get_json() == {"confirmed": True}
    assert hook_app.extensions["senddock.sns"].confirmed == [message["SubscribeURL"]]


def test_sendgrid_batch_bounce_and_complaint(hc: Any, engine: sa.Engine,
                                             signers: dict[str, Any]) -> None:
    campaign = sent_campaign(engine, ["gone@example.com", "angry@example.com"])
    by_email = jobs(engine, campaign["broadcast_id"])
    events = wp.sendgrid_events("gone@example.com", by_email["gone@example.com"]["message_id"])
    events += wp.sendgrid_events("angry@example.com",
                                 by_email["angry@example.com"]["message_id"],
                                 event="spamreport")[1:]
    raw = json.dumps(events).encode()
    signer = signers["sendgrid"]
    bad = hc.post("/webhooks/sendgrid", data=raw, headers=signer.headers(raw + b"x"))
    assert bad.status_code == 403
    answer = hc.post("/webhooks/sendgrid", data=raw, headers=signer.headers(raw))
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["effects"] == {"bounced": 1, "complaint": 1}
    with engine.connect() as conn:
        reasons = dict(conn.execute(sa.text("SELECT email, reason FROM suppressions")).all())
        complaints = conn.execute(sa.text("SELECT complaints FROM broadcasts WHERE id = :b"),
                                  {"b": campaign["broadcast_id"]}).scalar()
    assert reasons == {"gone@example.com": "bounced", "angry@example.com": "complaint"}
    assert complaints == 1
    # The same events in a new signed request (SendGrid re-sends): duplicates, no change.
    before = snapshot(engine)
    again = hc.post("/webhooks/sendgrid", data=raw, headers=signer.headers(raw, timestamp=int(
        __import__("time").time()) - 5))
    assert again.status_code == 200
    assert again.get_json()["duplicates"] == 2
    assert snapshot(engine) == before
    assert_exact_counts(engine, campaign["broadcast_id"])


def test_postmark_basic_auth_and_correlation(hc: Any, engine: sa.Engine) -> None:
    campaign = sent_campaign(engine, ["pm@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["pm@example.com"]
    body = json.dumps(wp.postmark_bounce("pm@example.com",
                                         correlation_id=str(job["correlation_id"])))
    good = {"Authorization": "Basic " + base64.b64encode(b"senddock:pm-secret").decode(),
            "Content-Type": "application/json"}
    before = snapshot(engine)
    for headers in ({}, {"Authorization": "Basic " + base64.b64encode(b"senddock:x").decode()}):
        assert hc.post("/webhooks/postmark", data=body, headers=headers).status_code == 401
    assert snapshot(engine) == before
    answer = hc.post("/webhooks/postmark", data=body, headers=good)
    assert answer.status_code == 200, answer.get_json()
    assert jobs(engine, campaign["broadcast_id"])["pm@example.com"]["status"] == "bounced"
    assert hc.post("/webhooks/postmark", data=body, headers=good).status_code == 409


def test_mailgun_matches_the_verp_envelope_sender(hc: Any, engine: sa.Engine) -> None:
    campaign = sent_campaign(engine, ["mg@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["mg@example.com"]
    verp = bounce_address("bounces@example.com", SECRET, job["id"])
    body = wp.mailgun_event(MAILGUN_KEY, "mg@example.com", "<not-ours@mailgun.example>",
                            sender=verp)
    answer = hc.post("/webhooks/mailgun", json=body)
    assert answer.status_code == 200, answer.get_json()
    assert jobs(engine, campaign["broadcast_id"])["mg@example.com"]["status"] == "bounced"
    forged_verp = wp.mailgun_event(MAILGUN_KEY, "mg@example.com", "<x@y>",
                                   sender=f"bounces+{job['id']:x}.aaaaaaaaaaaaaaaa@example.com")
    assert hc.post("/webhooks/mailgun", json=forged_verp).status_code == 404
    assert hc.post("/webhooks/mailgun", json=body).status_code == 409  # same token: replay
    forged = wp.mailgun_event("wrong-key", "mg@example.com", job["message_id"])
    assert hc.post("/webhooks/mailgun", json=forged).status_code == 403


def test_generic_webhook_token_and_body(hc: Any, engine: sa.Engine) -> None:
    campaign = sent_campaign(engine, ["g1@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["g1@example.com"]
    with engine.begin() as conn:
        token = feedback_intake.create_webhook_token(conn, "tests")
    auth = {"Authorization": f"Bearer {token}"}
    before = snapshot(engine)
    assert hc.post("/webhooks/generic", json={"type": "bounce", "email": "g1@example.com"}
                   ).status_code == 401
    assert hc.post("/webhooks/generic", json={"type": "bounce", "email": "g1@example.com"},
                   headers={"Authorization": "Bearer sdwh_forged"}).status_code == 401
    bad = hc.post("/webhooks/generic", json={"type": "bounced", "email": "nope"}, headers=auth)
    assert bad.status_code == 422
    assert set(bad.get_json()["error"]["fields"]) == {"type", "email"}
    unknown = hc.post("/webhooks/generic", headers=auth, json={
        "type": "bounce", "email": "g1@example.com", "message_id": "<nobody@nowhere>"})
    assert unknown.status_code == 404
    assert snapshot(engine) == before
    ok = hc.post("/webhooks/generic", headers=auth, json={
        "type": "complaint", "email": "g1@example.com", "message_id": job["message_id"]})
    assert ok.status_code == 200 and ok.get_json()["effects"] == {"complaint": 1}
    direct = hc.post("/webhooks/generic", headers=auth, json={
        "type": "bounce", "bounce": "hard", "email": "Elsewhere@Example.com",
        "reason": "550 5.1.1 gone (from our CRM)"})
    assert direct.status_code == 200
    with engine.connect() as conn:
        reasons = dict(conn.execute(sa.text("SELECT email, reason FROM suppressions")).all())
    assert reasons == {"g1@example.com": "complaint", "elsewhere@example.com": "bounced"}


def test_soft_bounces_suppress_at_the_threshold(hc: Any, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        token = feedback_intake.create_webhook_token(conn)
    auth = {"Authorization": f"Bearer {token}"}
    campaign = sent_campaign(engine, ["soft@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["soft@example.com"]
    for i in range(3):
        answer = hc.post("/webhooks/generic", headers=auth, json={
            "type": "bounce", "bounce": "soft", "email": "soft@example.com", "id": f"e{i}",
            "message_id": job["message_id"], "reason": "452 4.2.2 mailbox full"})
        assert answer.status_code == 200
        effects = answer.get_json()["effects"]
        assert effects == ({"soft_suppressed": 1} if i == 2 else {"soft": 1}), (i, effects)
    with engine.connect() as conn:
        reply = conn.execute(sa.text("SELECT reply FROM suppressions")).scalar_one()
    assert reply.startswith("3 soft bounces in 30 days")
    assert jobs(engine, campaign["broadcast_id"])["soft@example.com"]["status"] == "sent"


def test_complaint_rate_pauses_the_campaign(hc: Any, engine: sa.Engine,
                                            make_user: Callable[..., Any]) -> None:
    emails = [f"r{i}@example.com" for i in range(400)]
    campaign = make_campaign(engine, [*emails, "late@example.com"])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'sent', finished_at = now(),
                   message_id = '<' || id || '@example.com>'
             WHERE broadcast_id = :b AND email <> 'late@example.com'"""),
                     {"b": campaign["broadcast_id"]})
        token = feedback_intake.create_webhook_token(conn)
    by_email = jobs(engine, campaign["broadcast_id"])
    auth = {"Authorization": f"Bearer {token}"}
    statuses = []
    for email in ("r1@example.com", "r2@example.com"):  # 2 of 400 = 0.5 % >= 0.3 %
        answer = hc.post("/webhooks/generic", headers=auth, json={
            "type": "complaint", "email": email, "message_id": by_email[email]["message_id"]})
        assert answer.status_code == 200
        statuses.append(answer.get_json().get("paused_campaigns"))
    assert statuses == [None, [campaign["id"]]]  # 1/400 = 0.25 %: not yet
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT c.status, c.paused_reason FROM campaigns c "
                                   "WHERE c.id = :c"), {"c": campaign["id"]}).one()
    assert row.status == "paused"
    assert "complaint rate 0.50%" in row.paused_reason
    # Nothing more is claimed for it (the late job stays pending).
    with engine.begin() as conn:
        assert queue.claim_batch(conn, "w", 10, "example.com") == []


@pytest.mark.slow  # runs the senddock command in processes
def test_webhook_token_commands(hook_app: Any, hc: Any, db_url: str) -> None:
    """``senddock webhook-token create`` prints the token alone; it opens the generic
    webhook until ``senddock webhook-token revoke`` closes it."""
    import subprocess
    import sys

    from tests.conftest import ROOT, process_env

    def senddock(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "webapp", *args], capture_output=True,
                              text=True, env=process_env(settings(db_url)), cwd=ROOT,
                              timeout=60)

    made = senddock("webhook-token", "create", "--name", "crm")
    assert made.returncode == 0, made.stderr
    [token] = made.stdout.splitlines()
    assert token.startswith("sdwh_")
    body = {"type": "complaint", "email": "someone@example.com"}
    auth = {"Authorization": f"Bearer {token}"}
    assert hc.post("/webhooks/generic", json=body, headers=auth).status_code == 200
    revoked = senddock("webhook-token", "revoke", token[:10])
    assert revoked.returncode == 0, revoked.stderr
    assert hc.post("/webhooks/generic", json=body, headers=auth).status_code == 401
    assert senddock("webhook-token", "revoke", token[:10]).returncode != 0


def _sendgrid_variants(signature_b64: str) -> list[str]:
    """Other texts of the same SendGrid signature that verify: junk characters base64
    decoding skips, and ECDSA's mirror (r, n - s)."""
    from cryptography.hazmat.primitives.asymmetric.utils import (
        decode_dss_signature,
        encode_dss_signature,
    )

    n = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's order
    r, s = decode_dss_signature(base64.b64decode(signature_b64))
    mirror = base64.b64encode(encode_dss_signature(r, n - s)).decode()
    return [signature_b64 + "!", signature_b64 + "*", "*" + signature_b64, mirror,
            mirror + "!"]


def test_a_sendgrid_request_replayed_with_another_signature_text_is_a_replay(
        hc: Any, engine: sa.Engine, signers: dict[str, Any]) -> None:
    """Three replays of one soft bounce (signature plus "!", "*", or
    the mirror) were each applied and suppressed the address (soft-bounce limit 3)."""
    campaign = sent_campaign(engine, ["soft@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["soft@example.com"]
    events = wp.sendgrid_events("soft@example.com", job["message_id"], type="blocked",
                                reason="421 try later", status="4.0.0")
    for event in events:
        event.pop("sg_event_id")  # no provider event id: only the replay key protects
    raw = json.dumps(events).encode()
    headers = signers["sendgrid"].headers(raw)
    assert hc.post("/webhooks/sendgrid", data=raw, headers=headers).status_code == 200
    before = snapshot(engine)
    for variant in _sendgrid_variants(headers["X-Twilio-Email-Event-Webhook-Signature"]):
        replay = hc.post("/webhooks/sendgrid", data=raw, headers={
            **headers, "X-Twilio-Email-Event-Webhook-Signature": variant})
        assert replay.status_code == 409, (variant[-3:], replay.get_json())
    assert snapshot(engine) == before
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM suppressions")).scalar() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM job_events")).scalar() == 1


def test_a_refused_mailgun_request_consumes_its_token(hc: Any, engine: sa.Engine) -> None:
    """Mailgun signs only timestamp + token, so the signature of a
    refused request (here: about a message that is not ours, and one with a broken body)
    must not be usable again with another body."""
    campaign = sent_campaign(engine, ["mg2@example.com"])
    job = jobs(engine, campaign["broadcast_id"])["mg2@example.com"]
    foreign = wp.mailgun_event(MAILGUN_KEY, "mg2@example.com", "<not-ours@example.net>")
    assert hc.post("/webhooks/mailgun", json=foreign).status_code == 404
    broken = wp.mailgun_event(MAILGUN_KEY, "mg2@example.com", job["message_id"])
    broken["event-data"] = "nonsense"
    assert hc.post("/webhooks/mailgun", json=broken).status_code == 400
    before = snapshot(engine)
    for refused in (foreign, broken):
        ours = wp.mailgun_event(MAILGUN_KEY, "mg2@example.com", job["message_id"])
        ours["signature"] = refused["signature"]  # the refused request's signature
        answer = hc.post("/webhooks/mailgun", json=ours)
        assert answer.status_code == 409, answer.get_json()
    assert snapshot(engine) == before
    assert jobs(engine, campaign["broadcast_id"])["mg2@example.com"]["status"] == "sent"
    # A signature of its own still works.
    fresh = wp.mailgun_event(MAILGUN_KEY, "mg2@example.com", job["message_id"])
    assert hc.post("/webhooks/mailgun", json=fresh).status_code == 200
    assert jobs(engine, campaign["broadcast_id"])["mg2@example.com"]["status"] == "bounced"


# --- every registered provider: the same cases ------------------------------------------

Request = tuple[bytes, dict[str, str]]
BASIC = {"Authorization": "Basic " + base64.b64encode(b"senddock:pm-secret").decode()}


def _generic_auth(engine: sa.Engine) -> dict[str, str]:
    with engine.begin() as conn:
        return {"Authorization": "Bearer " + feedback_intake.create_webhook_token(conn, "t")}


def _mailgun_body(item: dict[str, Any]) -> Request:
    return json.dumps(item).encode(), {"Content-Type": "application/json"}


def _sns(message: dict[str, Any]) -> Request:
    return json.dumps(message).encode(), {"Content-Type": "text/plain; charset=UTF-8"}


def _signed_sendgrid(signers: dict[str, Any], body: bytes) -> Request:
    return body, signers["sendgrid"].headers(body)


# Per provider: (a valid request for the job, the same without its proof, a body that is
# not the provider's with a valid proof). A provider registered without a row here fails
# test_every_registered_provider_has_its_cases.
CASES: dict[str, tuple[Callable[..., Request], Callable[..., Request],
                       Callable[..., Request]]] = {
    "ses": (
        lambda s, e, email, job: _sns(s["sns"].notification(
            wp.ses_bounce(email, message_id=job["message_id"]))),
        lambda s, e, email, job: _sns({**s["sns"].notification(
            wp.ses_bounce(email, message_id=job["message_id"])),
            "Signature": base64.b64encode(b"x" * 256).decode()}),
        lambda s, e: _sns(s["sns"].notification({}, Message="{not json"))),
    "sendgrid": (
        lambda s, e, email, job: _signed_sendgrid(s, json.dumps(
            wp.sendgrid_events(email, job["message_id"])).encode()),
        lambda s, e, email, job: (json.dumps(wp.sendgrid_events(email, job["message_id"])
                                             ).encode(), {}),
        lambda s, e: _signed_sendgrid(s, b"{not json")),
    "postmark": (
        lambda s, e, email, job: (json.dumps(wp.postmark_bounce(
            email, correlation_id=str(job["correlation_id"]))).encode(), BASIC),
        lambda s, e, email, job: (json.dumps(wp.postmark_bounce(
            email, correlation_id=str(job["correlation_id"]))).encode(), {}),
        lambda s, e: (b"{not json", BASIC)),
    "mailgun": (
        lambda s, e, email, job: _mailgun_body(wp.mailgun_event(MAILGUN_KEY, email,
                                                                job["message_id"])),
        lambda s, e, email, job: _mailgun_body(wp.mailgun_event("not-the-key", email,
                                                                job["message_id"])),
        lambda s, e: _mailgun_body({"signature": wp.mailgun_sign(MAILGUN_KEY),
                                    "event-data": "nope"})),
    "generic": (
        lambda s, e, email, job: (json.dumps({"type": "bounce", "email": email, "id": "ev-1",
                                              "message_id": job["message_id"]}).encode(),
                                  _generic_auth(e)),
        lambda s, e, email, job: (json.dumps({"type": "bounce", "email": email,
                                              "message_id": job["message_id"]}).encode(), {}),
        lambda s, e: (b"{not json", _generic_auth(e))),
}


def test_every_registered_provider_has_its_cases() -> None:
    assert set(CASES) == set(registry.names())


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_provider_refuses_forgery_bad_bodies_and_replays(
        name: str, hc: Any, engine: sa.Engine, signers: dict[str, Any]) -> None:
    valid, unproven, bad_body = CASES[name]
    email = f"{name}@example.com"
    campaign = sent_campaign(engine, [email])
    job = jobs(engine, campaign["broadcast_id"])[email]
    before = snapshot(engine)
    body, headers = unproven(signers, engine, email, job)
    answer = hc.post(f"/webhooks/{name}", data=body, headers=headers)
    assert answer.status_code in (401, 403), answer.get_json()
    assert answer.get_json()["error"]["message"]
    body, headers = bad_body(signers, engine)
    answer = hc.post(f"/webhooks/{name}", data=body, headers=headers)
    assert answer.status_code == 400, answer.get_json()
    for junk in (b"", b"\xff\xfe", b"[" * 100_000, b'{"a": NaN}'):  # never a 500
        assert hc.post(f"/webhooks/{name}", data=junk, headers=headers).status_code < 500
    assert snapshot(engine) == before
    body, headers = valid(signers, engine, email, job)
    answer = hc.post(f"/webhooks/{name}", data=body, headers=headers)
    assert answer.status_code == 200, answer.get_json()
    assert jobs(engine, campaign["broadcast_id"])[email]["status"] == "bounced"
    after = snapshot(engine)
    again = hc.post(f"/webhooks/{name}", data=body, headers=headers)
    # A signed request is refused as a replay; the generic one (no signature) is
    # recognised by its event id. Either way nothing changes.
    assert again.status_code in (200, 409), again.get_json()
    if again.status_code == 200:
        assert again.get_json()["duplicates"] == 1
    assert snapshot(engine) == after


def test_an_unknown_provider_is_a_json_404(hc: Any) -> None:
    answer = hc.post("/webhooks/nosuch", json={})
    assert answer.status_code == 404
    assert "ses" in answer.get_json()["error"]["message"]


# --- bad input that once answered 500 ----------------------------------------------------

def _mailgun_signed_at(stamp: str, data: dict[str, Any]) -> dict[str, Any]:
    token = "t" * 50
    signature = hmac.new(MAILGUN_KEY.encode(), (stamp + token).encode(),
                         hashlib.sha256).hexdigest()
    return {"signature": {"timestamp": stamp, "token": token, "signature": signature},
            "event-data": data}


def test_a_non_ascii_mailgun_signature_is_403(hc: Any, engine: sa.Engine) -> None:
    before = snapshot(engine)
    for given in ("é" * 64, "\uff41" * 64, "\u00ff" * 32):
        body = wp.mailgun_event(MAILGUN_KEY, "mg@example.com", "<x@example.com>")
        body["signature"]["signature"] = given
        answer = hc.post("/webhooks/mailgun", data=json.dumps(body),
                         headers={"Content-Type": "application/json"})
        assert answer.status_code == 403, answer.get_json()
    assert snapshot(engine) == before


def test_a_non_ascii_verp_local_part_is_not_ours(hc: Any, engine: sa.Engine) -> None:
    before = snapshot(engine)
    for sender in ("bounces+é.ü@example.com", "bounces+1.\u00e9\u00e9@example.com",
                   "bounces+\uff46.aaaa@example.com"):
        body = wp.mailgun_event(MAILGUN_KEY, "mg@example.com", "<not-ours@example.net>",
                                sender=sender)
        answer = hc.post("/webhooks/mailgun", json=body)
        assert answer.status_code == 404, answer.get_json()
    assert snapshot(engine) == before


@pytest.mark.parametrize("stamp", ["nan", "NaN", "inf", "-inf", "1e400", "Infinity"])
def test_signed_timestamps_that_are_not_finite_are_400(
        stamp: str, hc: Any, engine: sa.Engine, signers: dict[str, Any]) -> None:
    before = snapshot(engine)
    data = wp.mailgun_event(MAILGUN_KEY, "mg@example.com", "<x@example.com>")["event-data"]
    answer = hc.post("/webhooks/mailgun", json=_mailgun_signed_at(stamp, data))
    assert answer.status_code == 400, answer.get_json()
    assert "not a number" in answer.get_json()["error"]["message"]
    body = json.dumps(wp.sendgrid_events("sg@example.com", "<x@example.com>")).encode()
    answer = hc.post("/webhooks/sendgrid", data=body,
                     headers=signers["sendgrid"].headers(body, timestamp=stamp))
    assert answer.status_code == 400, answer.get_json()
    assert "not a number" in answer.get_json()["error"]["message"]
    assert snapshot(engine) == before
