"""SmtpTransport against a real SMTP server on loopback (the smtp-sink), no mocks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from webapp.sink import SinkServer, read_records
from workers.building.message import build_mime
from workers.delivery.classify import ReplyClass
from workers.delivery.smtp import SmtpConfig, SmtpTransport

SENDER = "news@example.com"


def message(to: str = "zoe@example.com", message_id: str = "<1.abc@example.com>") -> bytes:
    return build_mime(
        from_addr=f"News <{SENDER}>",
        to_addr=to,
        subject="Hello ✓",
        text="Hi\n.leading dot\n",
        html="<p>Hi</p>",
        message_id=message_id,
        headers={"X-SendDock-Correlation-ID": "abc"},
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(params=[True, False], ids=["pipelining", "classic"])
def sink(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SinkServer]:
    """The sink with and without PIPELINING advertised: every test runs both the
    pipelined transaction (two round trips) and the classic one (four)."""
    server = SinkServer(
        record_path=tmp_path / "sink.jsonl",
        rules={
            "pipelining": request.param,
            "rules": [
                {"match": "hard-*@example.com", "reply": "550 5.1.1 User unknown"},
                {"match": "spam-*@example.com", "reply": "550 5.7.1 Message rejected as spam"},
                {
                    "match": "content-*@example.com",
                    "reply": "554 5.6.0 Bad content",
                    "stage": "data",
                },
                {"match": "later-*@example.com", "reply": "451 4.3.0 Try later"},
                {"match": "twice-*@example.com", "reply": "451 4.7.1 Greylisted", "times": 2},
                {"match": "full-*@example.com", "reply": "552 5.2.2 Mailbox full"},
            ]
        },
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def transport(sink: SinkServer) -> Iterator[SmtpTransport]:
    with SmtpTransport(SmtpConfig("127.0.0.1", sink.port), timeout=5, local_hostname="t") as t:
        yield t


def test_accepted_message_is_recorded(sink: SinkServer, transport: SmtpTransport) -> None:
    result = transport.send(SENDER, "zoe@example.com", message())
    assert result.reply_class is ReplyClass.SENT
    assert (result.code, result.stage) == (250, "data_end")
    assert result.duration_ms > 0
    [record] = sink.records()
    assert record["mail_from"] == SENDER
    assert record["rcpt_tos"] == ["zoe@example.com"]
    assert record["message_id"] == "<1.abc@example.com>"
    assert record["subject"] == "Hello ✓"
    assert record["size"] == len(message())


@pytest.mark.parametrize(
    ("recipient", "reply_class", "code", "enhanced", "stage"),
    [
        ("hard-1@example.com", ReplyClass.HARD_BOUNCE, 550, "5.1.1", "rcpt"),
        ("HARD-2@Example.COM", ReplyClass.HARD_BOUNCE, 550, "5.1.1", "rcpt"),
        ("spam-1@example.com", ReplyClass.REJECTED, 550, "5.7.1", "rcpt"),
        ("content-1@example.com", ReplyClass.REJECTED, 554, "5.6.0", "data_end"),
        ("later-1@example.com", ReplyClass.TRANSIENT, 451, "4.3.0", "rcpt"),
        ("full-1@example.com", ReplyClass.TRANSIENT, 552, "5.2.2", "rcpt"),
    ],
)
def test_refusals_are_classified_and_the_connection_is_kept(
    sink: SinkServer,
    transport: SmtpTransport,
    recipient: str,
    reply_class: ReplyClass,
    code: int,
    enhanced: str,
    stage: str,
) -> None:
    result = transport.send(SENDER, recipient, message())
    assert (result.reply_class, result.code, result.enhanced, result.stage) == (
        reply_class,
        code,
        enhanced,
        stage,
    )
    # The next message goes through on the same, cleanly reset connection.
    assert transport.send(SENDER, "ok@example.com", message()).reply_class is ReplyClass.SENT
    assert transport.connects == 1
    assert sink.sessions == 1
    assert [r["rcpt_tos"] for r in sink.records()] == [["ok@example.com"]]
    assert [r["rcpt_tos"] for r in sink.rejections()] == [[recipient]]


def test_times_n_then_accepted(sink: SinkServer, transport: SmtpTransport) -> None:
    classes = [
        transport.send(SENDER, "twice-1@example.com", message()).reply_class for _ in range(3)
    ]
    assert classes == [ReplyClass.TRANSIENT, ReplyClass.TRANSIENT, ReplyClass.SENT]
    # The count is per address.
    assert transport.send(SENDER, "twice-2@example.com", message()).reply_class is (
        ReplyClass.TRANSIENT
    )


def test_connection_is_reused_across_messages(sink: SinkServer, transport: SmtpTransport) -> None:
    for i in range(50):
        assert transport.send(SENDER, f"user{i}@example.com", message()).ok
    assert transport.connects == 1
    assert sink.sessions == 1
    assert len(sink.records()) == 50


def test_relay_421_at_mail_then_recovery(sink: SinkServer, transport: SmtpTransport) -> None:
    assert transport.send(SENDER, "zoe@example.com", message()).ok
    rules = {"rules": [{"match": "*", "reply": "421 4.7.0 Going down", "stage": "mail"}]}
    sink.set_rules(rules)
    result = transport.send(SENDER, "zoe@example.com", message())
    assert (result.reply_class, result.code, result.stage) == (ReplyClass.RELAY_THROTTLE, 421,
                                                               "mail")
    sink.set_rules({"rules": []})
    assert transport.send(SENDER, "zoe@example.com", message()).ok
    assert transport.connects >= 2  # closed after the relay failure, reopened lazily


def test_421_at_rcpt_is_relay_not_the_recipient(sink: SinkServer, transport: SmtpTransport) -> None:
    sink.set_rules({"rules": [{"match": "*", "reply": "421 4.7.0 Slow down"}]})
    result = transport.send(SENDER, "zoe@example.com", message())
    assert (result.reply_class, result.stage) == (ReplyClass.RELAY_THROTTLE, "rcpt")


def test_wrong_password_is_relay_at_auth(tmp_path: Path) -> None:
    rules = {"auth": {"username": "u", "password": "p"}}
    with SinkServer(record_path=tmp_path / "r.jsonl", rules=rules) as sink:
        bad = SmtpTransport(SmtpConfig("127.0.0.1", sink.port, "u", "wrong"), local_hostname="t")
        result = bad.send(SENDER, "zoe@example.com", message())
        assert (result.reply_class, result.code, result.stage) == (ReplyClass.RELAY, 535, "auth")
        assert result.enhanced == "5.7.8"
        assert bad.probe().reply_class is ReplyClass.RELAY

        anonymous = SmtpTransport(SmtpConfig("127.0.0.1", sink.port), local_hostname="t")
        result = anonymous.send(SENDER, "zoe@example.com", message())
        assert (result.reply_class, result.code, result.stage) == (ReplyClass.RELAY, 530, "mail")

        good = SmtpTransport(SmtpConfig("127.0.0.1", sink.port, "u", "p"), local_hostname="t")
        assert good.send(SENDER, "zoe@example.com", message()).ok
        assert good.probe().ok
        assert len(sink.records()) == 1
        for t in (bad, anonymous, good):
            t.close()


def test_connection_refused_is_relay_at_connect() -> None:
    transport = SmtpTransport(SmtpConfig("127.0.0.1", free_port()), timeout=2, local_hostname="t")
    result = transport.send(SENDER, "zoe@example.com", message())
    assert (result.reply_class, result.code, result.stage) == (ReplyClass.RELAY, None, "connect")
    probe = transport.probe()
    assert (probe.reply_class, probe.stage) == (ReplyClass.RELAY, "connect")


def test_probe_keeps_the_connection(sink: SinkServer, transport: SmtpTransport) -> None:
    probe = transport.probe()
    assert (probe.reply_class, probe.code, probe.stage) == (ReplyClass.SENT, 250, "noop")
    assert transport.send(SENDER, "zoe@example.com", message()).ok
    assert (transport.connects, sink.sessions) == (1, 1)


def test_sink_restarted_under_a_kept_connection_is_transparent(tmp_path: Path) -> None:
    port = free_port()
    first = SinkServer(port=port, record_path=tmp_path / "a.jsonl")
    first.start()
    transport = SmtpTransport(SmtpConfig("127.0.0.1", port), local_hostname="t")
    assert transport.send(SENDER, "zoe@example.com", message()).ok
    first.stop()
    with SinkServer(port=port, record_path=tmp_path / "b.jsonl") as second:
        # The kept connection is dead; the transport retries once on a new one.
        assert transport.send(SENDER, "zoe@example.com", message()).ok
        assert transport.connects == 2
        assert len(second.records()) == 1
    transport.close()


def start_sink_process(port: int, record: Path) -> subprocess.Popen[str]:
    code = "from webapp.sink import smtp_sink_command; smtp_sink_command()"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--port", str(port), "--record", str(record), "--quiet"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == f"smtp-sink listening on 127.0.0.1:{port}"
    return process


@pytest.mark.slow  # starts a process
def test_sink_killed_mid_session(tmp_path: Path) -> None:
    port = free_port()
    record = tmp_path / "sink.jsonl"
    process = start_sink_process(port, record)
    transport = SmtpTransport(SmtpConfig("127.0.0.1", port), timeout=5, local_hostname="t")
    try:
        assert transport.send(SENDER, "a@example.com", message()).ok
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        result = transport.send(SENDER, "b@example.com", message())
        # Relay trouble, never the recipient's fault: nothing is bounced or retried.
        assert result.reply_class is ReplyClass.RELAY
        assert result.stage in ("mail", "connect")
        assert transport.probe().reply_class is ReplyClass.RELAY
        process = start_sink_process(port, record)
        assert transport.send(SENDER, "c@example.com", message()).ok
        assert [r["rcpt_tos"] for r in read_records(record)] == [
            ["a@example.com"],
            ["c@example.com"],
        ]
    finally:
        transport.close()
        process.terminate()
        process.wait(timeout=10)


class SilentAfterData:
    """A scripted SMTP server that goes quiet after the message (or drops it)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn, conn.makefile("rb") as lines:
            if self.mode == "refuse_greeting":
                conn.sendall(b"554 5.3.2 No service for you\r\n")
                return
            conn.sendall(b"220 scripted\r\n")
            for line in lines:
                verb = line[:4].upper()
                if verb in (b"EHLO", b"MAIL", b"RCPT"):
                    conn.sendall(b"250 ok\r\n")
                elif verb == b"DATA":
                    if self.mode == "drop_at_data":
                        return
                    conn.sendall(b"354 go\r\n")
                elif line == b".\r\n":
                    if self.mode == "drop_after_dot":
                        return
                    time.sleep(3)  # "silent": longer than the client's timeout
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize(
    ("mode", "stage"),
    [("silent_after_dot", "data_end"), ("drop_after_dot", "data_end"), ("drop_at_data", "data")],
)
def test_timeout_or_disconnect_mid_message_is_transient(mode: str, stage: str) -> None:
    server = SilentAfterData(mode)
    transport = SmtpTransport(SmtpConfig("127.0.0.1", server.port), timeout=0.5, local_hostname="t")
    try:
        result = transport.send(SENDER, "zoe@example.com", message())
        assert (result.reply_class, result.code, result.stage) == (
            ReplyClass.TRANSIENT,
            None,
            stage,
        )
    finally:
        transport.close()
        server.close()


@pytest.mark.slow  # starts a process
def test_refused_greeting_is_relay() -> None:
    server = SilentAfterData("refuse_greeting")
    transport = SmtpTransport(SmtpConfig("127.0.0.1", server.port), timeout=2, local_hostname="t")
    try:
        result = transport.send(SENDER, "zoe@example.com", message())
        assert (result.reply_class, result.code, result.stage) == (
            ReplyClass.RELAY,
            554,
            "greeting",
        )
        assert result.enhanced == "5.3.2"
    finally:
        transport.close()
        server.close()


# -- STARTTLS ----------------------------------------------------------------


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A throwaway certificate for localhost/127.0.0.1, made with the openssl CLI.

    (The ``cryptography`` package is not a dependency of the project.)
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key_path),
            "-out",
            str(cert_path),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert_path, key_path


@pytest.fixture
def tls_sink(tmp_path: Path) -> Iterator[tuple[SinkServer, Path]]:
    cert, key = self_signed_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    rules = {"auth": {"username": "u", "password": "p"}}
    with SinkServer(record_path=tmp_path / "r.jsonl", rules=rules, tls_context=context) as sink:
        yield sink, cert


def test_starttls_with_auth(tls_sink: tuple[SinkServer, Path]) -> None:
    sink, cert = tls_sink
    trusted = ssl.create_default_context(cafile=str(cert))
    config = SmtpConfig("127.0.0.1", sink.port, "u", "p", tls="starttls")
    with SmtpTransport(config, local_hostname="t", ssl_context=trusted) as transport:
        assert transport.probe().ok
        for i in range(3):
            assert transport.send(SENDER, f"user{i}@example.com", message()).ok
        assert transport.connects == 1
    assert len(sink.records()) == 3


def test_untrusted_certificate_is_relay_at_starttls(tls_sink: tuple[SinkServer, Path]) -> None:
    sink, _cert = tls_sink
    config = SmtpConfig("127.0.0.1", sink.port, "u", "p", tls="starttls")
    with SmtpTransport(config, local_hostname="t") as transport:
        result = transport.send(SENDER, "zoe@example.com", message())
    assert (result.reply_class, result.stage) == (ReplyClass.RELAY, "starttls")
    assert "certificate" in result.text.lower()
    assert sink.records() == []


def test_verify_false_accepts_a_self_signed_certificate(tls_sink: tuple[SinkServer, Path]) -> None:
    sink, _cert = tls_sink
    config = SmtpConfig("127.0.0.1", sink.port, "u", "p", tls="starttls", verify=False)
    with SmtpTransport(config, local_hostname="t") as transport:
        assert transport.send(SENDER, "zoe@example.com", message()).ok


def test_implicit_tls(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    sink = SinkServer(record_path=tmp_path / "r.jsonl", tls_context=context, implicit_tls=True)
    with sink:
        trusted = ssl.create_default_context(cafile=str(cert))
        config = SmtpConfig("127.0.0.1", sink.port, tls="ssl")
        with SmtpTransport(config, local_hostname="t", ssl_context=trusted) as transport:
            assert transport.send(SENDER, "zoe@example.com", message()).ok
        with SmtpTransport(config, local_hostname="t") as untrusted:
            result = untrusted.send(SENDER, "zoe@example.com", message())
        assert (result.reply_class, result.stage) == (ReplyClass.RELAY, "starttls")
        plain = SmtpConfig("127.0.0.1", sink.port, tls="none")
        with SmtpTransport(plain, timeout=2, local_hostname="t") as mismatched:
            assert mismatched.send(SENDER, "zoe@example.com", message()).reply_class is (
                ReplyClass.RELAY
            )
        assert len(sink.records()) == 1


def test_starttls_not_offered_is_relay(sink: SinkServer) -> None:
    config = SmtpConfig("127.0.0.1", sink.port, tls="starttls")
    with SmtpTransport(config, local_hostname="t") as transport:
        result = transport.send(SENDER, "zoe@example.com", message())
    assert (result.reply_class, result.stage) == (ReplyClass.RELAY, "starttls")


def test_one_thread_throughput(sink: SinkServer, transport: SmtpTransport) -> None:
    """Smoke check that nothing reconnects or stalls per message (no timing assertion)."""
    payload = message()
    for i in range(300):
        assert transport.send(SENDER, f"bulk{i}@example.com", payload).ok
    assert transport.connects == 3  # recycled after every 100 messages, as Postfix does


def test_pipelining_is_used_when_the_relay_offers_it(sink: SinkServer,
                                                     transport: SmtpTransport) -> None:
    assert transport.send(SENDER, "zoe@example.com", message()).ok
    offered = sink.rules.pipelining
    assert transport._smtp is not None
    assert bool(transport._smtp.has_extn("pipelining")) is offered
    # A refused recipient in the middle of a pipelined envelope leaves the session in step.
    assert transport.send(SENDER, "hard-9@example.com", message()).reply_class is \
        ReplyClass.HARD_BOUNCE
    assert transport.send(SENDER, "amy@example.com", message()).ok
    assert [r["rcpt_tos"] for r in sink.records()] == [["zoe@example.com"], ["amy@example.com"]]
    assert transport.connects == 1
