"""SENDDOCK_SMTP_URL parsing and redaction."""

from __future__ import annotations

import pytest

from workers.core.relays import SmtpConfig, parse_smtp_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("smtp://localhost", SmtpConfig("localhost", 25, None, None, "none")),
        ("smtp://127.0.0.1:2525", SmtpConfig("127.0.0.1", 2525, None, None, "none")),
        (
            "smtp://user:secret@mail.example.com:587?tls=starttls",
            SmtpConfig("mail.example.com", 587, "user", "secret", "starttls"),
        ),
        (
            "smtp://mail.example.com?tls=starttls",
            SmtpConfig("mail.example.com", 25, tls="starttls"),
        ),
        ("smtp://mail.example.com?tls=ssl", SmtpConfig("mail.example.com", 465, tls="ssl")),
        ("smtps://mail.example.com", SmtpConfig("mail.example.com", 465, tls="ssl")),
        ("smtps://mail.example.com:2465", SmtpConfig("mail.example.com", 2465, tls="ssl")),
        (
            "smtp://AKIA%2Fx:p%40ss%3Aw%2Fo%25rd@email-smtp.eu-west-1.amazonaws.com:587?tls=starttls",
            SmtpConfig(
                "email-smtp.eu-west-1.amazonaws.com", 587, "AKIA/x", "p@ss:w/o%rd", "starttls"
            ),
        ),
        ("smtp://apikey@smtp.example.com?tls=none",
         SmtpConfig("smtp.example.com", 25, "apikey", None)),
        (
            "smtp://h:25?tls=starttls&verify=false",
            SmtpConfig("h", 25, tls="starttls", verify=False),
        ),
        ("smtp://[::1]:2525", SmtpConfig("::1", 2525)),
    ],
)
def test_parse_smtp_url(url: str, expected: SmtpConfig) -> None:
    assert parse_smtp_url(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://mail.example.com", "smtp://"),
        ("mail.example.com:25", "smtp://"),
        ("smtp://", "no host"),
        ("smtp://:25", "no host"),
        ("smtp://mail.example.com:99999", "port"),
        ("smtp://mail.example.com:abc", "port"),
        ("smtp://mail.example.com:0", "port"),
        ("smtp://mail.example.com?tls=maybe", "tls="),
        ("smtp://mail.example.com?tlsmode=ssl", "unknown parameter"),
        ("smtps://mail.example.com?tls=none", "smtps"),
        ("smtp://mail.example.com/path", "path"),
        ("smtp://:secret@mail.example.com", "no user name"),
        ("smtp://h?verify=perhaps", "verify"),
        # credentials are never sent in the clear unless the URL says so itself
        ("smtp://user:secret@mail.example.com:587", "no encryption"),
        ("smtp://h?cafile=/etc/ca.pem", "SENDDOCK_SMTP_CA_FILE"),
    ],
)
def test_bad_urls_get_a_clear_error(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_smtp_url(url)


def test_errors_never_echo_the_password() -> None:
    with pytest.raises(ValueError) as caught:
        parse_smtp_url("smtp://user:hunter2@mail.example.com:99999")
    assert "hunter2" not in str(caught.value)


def test_redacted_and_repr_hide_the_password() -> None:
    config = parse_smtp_url("smtp://us%40er:hunter2@mail.example.com:587?tls=starttls")
    assert config.redacted() == "smtp://us%40er:***@mail.example.com:587?tls=starttls"
    assert "hunter2" not in repr(config)
    assert parse_smtp_url(config.redacted().replace("***", "x")).username == "us@er"
    assert parse_smtp_url("smtp://h").redacted() == "smtp://h:25?tls=none"
