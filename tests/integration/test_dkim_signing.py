"""Mail from every path is DKIM-signed and verifies the way a receiver verifies it:
the real pool sends to a real SMTP server, and dkimpy's verifier and OpenDKIM (when
installed) fetch the key from a real DNS server on loopback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dkim
import pytest
import sqlalchemy as sa

from harness import opendkim
from harness.dns import DnsServer
from tests.conftest import Api, wait_for
from webapp.domain import campaigns, domain_checks, lists, verifications
from workers.building import dkim as sd
from workers.core.settings import Config
from workers.delivery.pool import Pool

SECRET = "test-secret-key-not-for-production"
LONG_SUBJECT = "Ünïcödé newsletter for {{ name }}: " + "a rather long subject line " * 8


def receiver(dns_server: DnsServer) -> Callable[..., bytes]:
    resolver = domain_checks.make_resolver(dns_server.resolver_setting)

    def dnsfunc(name: bytes, timeout: int = 5) -> bytes:
        records = domain_checks.txt_records(resolver, name.decode().rstrip("."))
        return records[0].encode() if records else b""

    return dnsfunc


def verify_all(raw: bytes, dnsfunc: Callable[..., bytes]) -> list[bytes]:
    """The d=/s= of every signature on ``raw``; asserts each one verifies."""
    checker = dkim.DKIM(raw)
    signatures = [v for k, v in checker.headers if k.lower() == b"dkim-signature"]
    assert signatures, raw[:400]
    for index in range(len(signatures)):
        assert checker.verify(index, dnsfunc=dnsfunc), (index, raw[:1200])
    return [sd.header_fields(b"X: " + s + b"\r\n")[0][1] for s in signatures]


def publish(engine: sa.Engine, dns_server: DnsServer, domain: str) -> list[sd.KeyRecord]:
    with engine.begin() as conn:
        keys = [sd.create_key(conn, SECRET, domain, algorithm=alg) for alg in sd.ALGORITHMS]
    for key in keys:
        dns_server.zone.txt(key.record_name, key.record_value)
    return keys


def test_every_path_is_signed_and_verifies_through_dns(
        engine: sa.Engine, sink: Any, dns_server: DnsServer,
        config_for: Callable[..., Config], tmp_path: Path, api: Api) -> None:
    keys = publish(engine, dns_server, "example.com")
    assert {k.status for k in keys} == {"active"}
    config = config_for(sink.port)
    with engine.begin() as conn:
        lst = lists.create_list(conn, "Signed")
        lists.add_subscribers(conn, lst["id"], [{"email": "zoë@example.org", "name": "Zoë"},
                                                {"email": "ann@example.org", "name": "Ann"}])
        campaign = campaigns.create(conn, {
            "name": "Signed", "list_id": lst["id"], "subject": LONG_SUBJECT,
            "from": "Équipe Nouvelles <news@example.com>",
            "text": "Bonjour {{ name }} — unsubscribe: {{ unsubscribe_url }}\n\n\n",
            "html": "<p>Bonjour {{ name }}</p>  \n<a href='{{ unsubscribe_url }}'>x</a>"},
            default_from="news@example.com")
        campaigns.send(conn, campaign["id"])
        campaigns.test_send(conn, campaign["id"], "tester@example.org")
        verifications.request(conn, config, verifications.parse_request({
            "user_id": "u1", "email": "new@example.org",
            "verify_url": "https://app.example.com/v?t=1"}), actor="test")
    # A transactional kind (docs/design.md §21) through the public API, its subject non-ASCII too.
    kind = api.client.put("/api/v1/kinds/onboarding", headers=api.headers, json={
        "class": "lifecycle", "subject": "Día 3, {{ data.first_name }}: términos y más",
        "text": "Hola {{ data.first_name }}", "sample_data": {"first_name": "Ada"}})
    assert kind.status_code in (200, 201), kind.get_json()
    sent = api.post("/messages", {"kind": "onboarding", "user_id": "u-9",
                                  "email": "ada@example.org", "data": {"first_name": "Añá"}})
    assert sent.status_code == 202, sent.get_json()
    pool = Pool(engine, config, node="dkim-node")
    pool.start()
    try:
        wait_for(lambda: len(sink.raw_messages()) == 5, timeout=60, message="5 messages")
    finally:
        pool.stop()
    dnsfunc = receiver(dns_server)
    subjects = []
    for index, raw in enumerate(sink.raw_messages()):
        if opendkim.unavailable_reason() is None:  # a second, independent receiver
            assert opendkim.verify(raw, dns_server.port, tmp_path / f"od{index}") == [
                "pass", "pass"], raw[:600]
        signatures = verify_all(raw, dnsfunc)
        assert len(signatures) == 2  # RSA-2048 and ed25519, both d=example.com
        assert all(b"d=example.com" in s for s in signatures)
        subjects.append(raw)
    assert any(b"List-Unsubscribe-Post" in raw for raw in subjects)
    assert any(b"Auto-Submitted" in raw for raw in subjects)  # transactional mail
    assert dns_server.asked("sd1._domainkey.example.com", "TXT")
    assert dns_server.asked("ed-sd1._domainkey.example.com", "TXT")


def test_a_domain_without_a_key_goes_out_unsigned_and_a_rotation_takes_over(
        engine: sa.Engine, dns_server: DnsServer) -> None:
    ring = sd.KeyRing(engine, SECRET, refresh=0)
    message = b"From: a@example.net\r\nSubject: x\r\n\r\nbody\r\n"
    assert ring.sign(message, "example.net") == message
    (first,) = publish(engine, dns_server, "example.net")[:1]
    signed = ring.sign(message, "example.net")
    assert b"s=sd1;" in signed and dkim.verify(signed, dnsfunc=receiver(dns_server))
    with engine.begin() as conn:
        nxt = sd.create_key(conn, SECRET, "example.net", algorithm="rsa")
        assert (nxt.selector, nxt.status) == ("sd2", "next")
        with pytest.raises(sd.DkimError, match="next rsa key"):
            sd.create_key(conn, SECRET, "example.net", algorithm="rsa")
    assert b"s=sd1;" in ring.sign(message, "example.net")  # next does not sign yet
    dns_server.zone.txt(nxt.record_name, nxt.record_value)
    with engine.begin() as conn:
        sd.activate_key(conn, "example.net", "sd2")
        statuses = {k.selector: k.status for k in sd.list_keys(conn, "example.net")}
        with pytest.raises(sd.DkimError, match="signs its mail"):
            sd.delete_key(conn, "example.net", "sd2")
    assert statuses == {"sd1": "retired", "sd2": "active", "ed-sd1": "active"}
    rotated = ring.sign(message, "example.net")
    assert b"s=sd2;" in rotated and dkim.verify(rotated, dnsfunc=receiver(dns_server))
    # The retired key's record stays published: mail signed before still verifies.
    assert dkim.verify(signed, dnsfunc=receiver(dns_server))
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT private_key_encrypted FROM dkim_keys "
                                      "WHERE selector = 'sd2'")).scalar_one()
    assert stored.startswith("v1.") and "PRIVATE" not in stored
    assert first.selector == "sd1"


def test_a_key_the_secret_key_cannot_open_is_skipped_not_fatal(
        engine: sa.Engine, dns_server: DnsServer) -> None:
    publish(engine, dns_server, "example.org")
    ring = sd.KeyRing(engine, "another secret", refresh=0)
    message = b"From: a@example.org\r\nSubject: x\r\n\r\nbody\r\n"
    assert ring.sign(message, "example.org") == message
    errors: list[str] = []
    with engine.connect() as conn:
        assert sd.load_signing_keys(conn, "another secret", errors) == {}
    assert len(errors) == 2 and "SENDDOCK_SECRET_KEY" in errors[0]


def test_opendkim_fails_a_changed_message(dns_server: DnsServer, tmp_path: Path) -> None:
    """The OpenDKIM receiver is not a rubber stamp: a changed body or an unpublished key
    fails there too."""
    if opendkim.unavailable_reason():
        pytest.skip(opendkim.INSTALL_HINT)
    key = sd.generate_private_key("rsa")
    dns_server.zone.txt("sd1._domainkey.example.com",
                        sd.dns_value("rsa", sd.public_key_b64(key)))
    signed = sd.sign_message(b"From: a@example.com\r\nSubject: x\r\n\r\nbody\r\n",
                             [sd.SigningKey("example.com", "sd1", "rsa", key)])
    assert opendkim.verify(signed, dns_server.port, tmp_path / "ok") == ["pass"]
    assert opendkim.verify(signed.replace(b"body", b"bodY"), dns_server.port,
                           tmp_path / "changed") == ["fail"]
    dns_server.zone.clear()
    assert opendkim.verify(signed, dns_server.port, tmp_path / "gone") != ["pass"]


@pytest.mark.slow
def test_mail_relayed_by_postfix_still_verifies(engine: sa.Engine, relay: Any,
                                                dns_server: DnsServer, tmp_path: Path,
                                                config_for: Callable[..., Config]) -> None:
    """Through a real relay: what Postfix delivers (its Received: on top, LF line ends as
    a mailbox stores them) verifies at dkimpy and OpenDKIM."""
    publish(engine, dns_server, "example.com")
    with engine.begin() as conn:
        lst = lists.create_list(conn, "Relayed")
        lists.add_subscribers(conn, lst["id"], [{"email": "zoë@example.org", "name": "Zoë"}])
        campaign = campaigns.create(conn, {
            "name": "Relayed", "list_id": lst["id"], "subject": LONG_SUBJECT,
            "from": "Équipe <news@example.com>",
            "text": "Bonjour {{ name }}\n.leading dot\nFrom the start\n{{ unsubscribe_url }}"},
            default_from="news@example.com")
        campaigns.send(conn, campaign["id"])
    pool = Pool(engine, config_for(SMTP_URL=relay.smtp_url()), node="dkim-relay")
    pool.start()
    try:
        (delivered,) = relay.wait_for_messages(1, timeout=60)
    finally:
        pool.stop()
    raw = delivered.data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    assert raw.startswith(b"Received:")
    verify_all(raw, receiver(dns_server))
    if opendkim.unavailable_reason() is None:
        assert opendkim.verify(raw, dns_server.port, tmp_path / "od") == ["pass", "pass"]
