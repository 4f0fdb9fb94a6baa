"""The private Postfix fixture does what its docstring promises (harness.postfix):
delivery with envelope and bytes, STARTTLS with the private CA, SASL from the private
sasldb, maps the test writes, main.cf settings, its own log, stop/start."""

from __future__ import annotations

import smtplib
import ssl

import pytest

from harness import postfix
from harness.postfix import Postfix

MESSAGE = b"From: a@example.com\r\nTo: b@example.org\r\nSubject: hi\r\n\r\nhello\r\n"


def _send(relay: Postfix, sender: str, rcpt: str, *, tls: bool = False,
          login: tuple[str, str] | None = None, helo: str = "client.senddock.test") -> None:
    with smtplib.SMTP(relay.host, relay.port, local_hostname=helo, timeout=10) as smtp:
        if tls:
            smtp.starttls(context=ssl.create_default_context(cafile=str(relay.ca_file)))
        if login:
            smtp.login(*login)
        smtp.sendmail(sender, [rcpt], MESSAGE)


def test_delivers_with_envelope_and_bytes(relay: Postfix) -> None:
    _send(relay, "news@example.com", "bob@example.org")
    [got] = relay.wait_for_messages(1)
    assert (got.sender, got.recipient) == ("news@example.com", "bob@example.org")
    assert got.message["Subject"] == "hi"
    assert got.data.endswith(b"hello\n")
    assert "Date" not in got.message  # nothing added but Received
    # The pipe has written the message before its agent logs status=sent: wait for it.
    relay.wait_for_log(rf"{got.queue_id}: to=<bob@example.org>.*status=sent")
    assert relay.count(rf"{got.queue_id}: to=<bob@example.org>.*status=sent") == 1
    assert len(relay.accepted_times()) == 1


def test_starttls_with_private_ca_and_sasl(relay: Postfix) -> None:
    _send(relay, "news@example.com", "bob@example.org", tls=True,
          login=(postfix.USER, postfix.PASSWORD))
    relay.wait_for_messages(1)
    assert relay.count(r"TLS connection established") >= 1
    assert relay.count(rf"sasl_username={postfix.USER}") == 1
    with pytest.raises(ssl.SSLCertVerificationError), \
            smtplib.SMTP(relay.host, relay.port, timeout=10) as smtp:
        smtp.starttls(context=ssl.create_default_context())  # the system store: untrusted


def test_wrong_password_is_logged_by_postfix(relay: Postfix) -> None:
    with pytest.raises(smtplib.SMTPAuthenticationError):
        _send(relay, "news@example.com", "bob@example.org", login=(postfix.USER, "wrong"))
    relay.wait_for_log(r"SASL \S+ authentication failed")
    relay.add_user("other@relay.test", "pw2")
    _send(relay, "news@example.com", "bob@example.org", login=("other@relay.test", "pw2"))
    relay.wait_for_messages(1)


def test_maps_and_settings_then_reset(relay: Postfix) -> None:
    relay.write_map("sender_access", {"news@example.com": "554 5.7.1 not you"})
    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        _send(relay, "news@example.com", "bob@example.org")
    code, text = refused.value.recipients["bob@example.org"]
    assert code == 554 and b"Sender address rejected: not you" in text  # at RCPT
    relay.configure(smtpd_delay_reject="no")
    with pytest.raises(smtplib.SMTPSenderRefused):
        _send(relay, "news@example.com", "bob@example.org")
    relay.reset()
    _send(relay, "news@example.com", "bob@example.org")
    assert len(relay.wait_for_messages(1)) == 1


def test_anvil_limit_applies_to_loopback(relay: Postfix) -> None:
    relay.configure(smtpd_client_recipient_rate_limit="2")
    for i in range(2):
        _send(relay, "news@example.com", f"r{i}@example.org")
    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        _send(relay, "news@example.com", "r3@example.org")
    code, text = refused.value.recipients["r3@example.org"]
    assert code == 450 and b"too many recipients" in text


def test_stop_and_start_again(relay: Postfix) -> None:
    relay.stop()
    with pytest.raises(OSError):
        _send(relay, "news@example.com", "bob@example.org")
    relay.start()
    _send(relay, "news@example.com", "bob@example.org")
    relay.wait_for_messages(1)
