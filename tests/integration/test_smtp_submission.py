"""SMTP submission (docs/smtp.md) with clients no one here wrote: Python's smtplib
(STARTTLS + AUTH, implicit TLS), Django's SMTP email backend, swaks and msmtp. Each
message goes through the real server into PostgreSQL and out through the delivery pool
to the sink; every refusal a client can cause is checked by its reply code."""

from __future__ import annotations

import base64
import shutil
import smtplib
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from email import message_from_bytes
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.postfix import make_certificates
from harness.postfix import running as postfix_running
from harness.postfix import unavailable_reason as postfix_unavailable
from tests.conftest import Api, free_port, process_env, settings, wait_for
from webapp.submission import SubmissionServer, SubmissionSettings
from workers.core.settings import load
from workers.delivery.pool import Pool

RECEIPT = {"class": "lifecycle", "subject": "unused for SMTP", "text": "unused",
           "dedupe_window": 0}


@pytest.fixture()
def certs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate for localhost/127.0.0.1 it signs."""
    return make_certificates(tmp_path, "submission.senddock.test")


class Running:
    def __init__(self, server: SubmissionServer, config: Any, ca: Path) -> None:
        self.server = server
        self.config = config
        self.ca = ca

    @property
    def port(self) -> int:
        return self.server.ports["starttls"]

    @property
    def tls_port(self) -> int:
        return self.server.ports["tls"]

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def client(self) -> smtplib.SMTP:
        smtp = smtplib.SMTP("127.0.0.1", self.port, timeout=30)
        smtp.starttls(context=self.context())
        return smtp


@pytest.fixture()
def start_submission(engine: sa.Engine, db_url: str, sink: Any,
                     certs: tuple[Path, Path, Path]) -> Iterator[Callable[..., Running]]:
    started: list[SubmissionServer] = []
    ca, cert, key = certs

    def start(**overrides: str) -> Running:
        values = {"SUBMISSION_LISTEN": "127.0.0.1:0", "SUBMISSION_TLS_LISTEN": "127.0.0.1:0",
                  "SUBMISSION_CERT": str(cert), "SUBMISSION_KEY": str(key),
                  "SUBMISSION_HOSTNAME": "localhost"}
        values.update(overrides)
        config = load(settings(db_url, sink.port, **{
            k: v for k, v in values.items() if not k.startswith("SUBMISSION_")}))
        server = SubmissionServer(engine, config, SubmissionSettings.load(config, {
            k: v for k, v in values.items() if k.startswith("SUBMISSION_")})).start()
        started.append(server)
        return Running(server, config, ca)

    yield start
    for server in started:
        server.stop()


@pytest.fixture()
def token(api: Api, make_user: Callable[..., dict[str, Any]]) -> str:
    r = api.client.put("/api/v1/kinds/receipt", headers=api.headers, json=RECEIPT)
    assert r.status_code in (200, 201), r.get_json()
    return str(make_user("support")["token"])


def raw_message(*, to: str = "ann@example.org", message_id: str = "<m1@shop.example.com>",
                extra: str = "", body: str = "Grüße — your receipt.\r\n") -> bytes:
    return (f"From: Shop <orders@shop.example.com>\r\nTo: {to}\r\n"
            f"Subject: Receipt\r\nMessage-ID: {message_id}\r\n"
            "X-SendDock-Kind: receipt\r\nX-SendDock-User: u-42\r\n"
            "Bcc: secret@example.org\r\nMIME-Version: 1.0\r\n"
            "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n"
            f"{extra}\r\n{body}").encode()


def submit(smtp: smtplib.SMTP, raw: bytes, recipients: list[str],
           sender: str = "orders@shop.example.com") -> tuple[int, bytes]:
    code, reply = smtp.mail(sender, ["BODY=8BITMIME"])
    assert code == 250, reply
    for rcpt in recipients:
        code, reply = smtp.rcpt(rcpt)
        assert code == 250, reply
    return smtp.data(raw)


def jobs(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT id, kind, email, user_ref, status, correlation_id, payload "
            "FROM delivery_jobs WHERE kind = 'receipt' ORDER BY id")))


def deliver(engine: sa.Engine, config: Any, sink: Any, n: int) -> list[bytes]:
    pool = Pool(engine, config, node="smtp-submission")
    pool.start()
    try:
        wait_for(lambda: len(sink.raw_messages()) >= n, message=f"{n} messages at the sink")
    finally:
        pool.stop()
    return sink.raw_messages()


def test_starttls_auth_stores_once_queues_per_recipient_and_delivers_byte_for_byte(
        engine: sa.Engine, sink: Any, token: str,
        start_submission: Callable[..., Running]) -> None:
    running = start_submission()
    raw = raw_message()
    with running.client() as smtp:
        smtp.login("anything", token)
        code, reply = submit(smtp, raw, ["ann@example.org", "bob@example.org"])
    assert code == 250, reply
    rows = jobs(engine)
    assert [r.email for r in rows] == ["ann@example.org", "bob@example.org"]
    assert {r.user_ref for r in rows} == {"u-42"}
    for row in rows:  # the 250 names each job's correlation id
        assert str(row.correlation_id).encode() in reply
        assert row.payload["data"]["source"]["via"] == "smtp"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM smtp_messages")).scalar() == 1
    delivered = deliver(engine, running.config, sink, 2)
    assert {r["rcpt_tos"][0] for r in sink.records()} == {"ann@example.org", "bob@example.org"}
    for out in delivered:
        assert b"Bcc:" not in out and b"X-SendDock-Kind" not in out
        assert b"X-SendDock-User" not in out
        assert b"X-SendDock-Correlation-ID: " in out
        assert out.endswith("Grüße — your receipt.\r\n".encode())
        # Every header the client wrote, other than ours and Bcc, is there as written.
        for line in (b"From: Shop <orders@shop.example.com>", b"Subject: Receipt",
                     b"Message-ID: <m1@shop.example.com>", b"Content-Transfer-Encoding: 8bit"):
            assert line in out


def test_implicit_tls_and_auth_login(engine: sa.Engine, token: str,
                                     start_submission: Callable[..., Running]) -> None:
    running = start_submission()
    with smtplib.SMTP_SSL("127.0.0.1", running.tls_port, context=running.context(),
                          timeout=30) as smtp:
        smtp.ehlo()
        smtp.user, smtp.password = "support@example.com", token
        code, reply = smtp.auth("LOGIN", smtp.auth_login)
        assert code == 235, reply
        code, reply = submit(smtp, raw_message(), ["ann@example.org"])
    assert code == 250, reply
    assert len(jobs(engine)) == 1


def test_a_resend_after_a_lost_250_is_answered_by_the_same_jobs(
        engine: sa.Engine, token: str, start_submission: Callable[..., Running]) -> None:
    running = start_submission()
    raw = raw_message(message_id="<resend-1@shop.example.com>")
    with running.client() as smtp:
        smtp.login("x", token)
        code, first = submit(smtp, raw, ["ann@example.org"])
        assert code == 250
    # The client never read that 250 (connection lost): it sends the same message again.
    with running.client() as smtp:
        smtp.login("x", token)
        code, again = submit(smtp, raw, ["ann@example.org"])
    assert code == 250, again
    assert b"already accepted" in again
    rows = jobs(engine)
    assert len(rows) == 1
    assert str(rows[0].correlation_id).encode() in first
    assert str(rows[0].correlation_id).encode() in again
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM smtp_messages")).scalar() == 1


def test_auth_is_refused_before_tls_without_a_token_and_for_a_role_that_cannot_send(
        token: str, make_user: Callable[..., dict[str, Any]],
        start_submission: Callable[..., Running]) -> None:
    running = start_submission()
    with smtplib.SMTP("127.0.0.1", running.port, timeout=30) as smtp:
        smtp.ehlo()
        assert "auth" not in smtp.esmtp_features  # not offered before TLS
        code, reply = smtp.docmd("AUTH", "PLAIN " + base64.b64encode(
            f"\0x\0{token}".encode()).decode())
        assert code == 530 or code == 538, reply  # STARTTLS first
        code, reply = smtp.mail("orders@shop.example.com")
        assert code == 530, reply
    with running.client() as smtp:
        with pytest.raises(smtplib.SMTPAuthenticationError) as bad:
            smtp.login("x", "sd_not-a-token")
        assert bad.value.smtp_code == 535
    marketer = make_user("marketer")["token"]
    with running.client() as smtp:
        with pytest.raises(smtplib.SMTPAuthenticationError) as refused:
            smtp.login("x", marketer)
        assert refused.value.smtp_code == 535
        assert b"marketer" in refused.value.smtp_error


def test_plain_auth_on_loopback_only_when_allowed(
        engine: sa.Engine, token: str, start_submission: Callable[..., Running]) -> None:
    running = start_submission(SUBMISSION_PLAIN_AUTH="on")
    with smtplib.SMTP("127.0.0.1", running.port, timeout=30) as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw_message(), ["ann@example.org"])
    assert code == 250, reply
    with pytest.raises(Exception, match="loopback"):
        SubmissionSettings.load(running.config, {"SUBMISSION_LISTEN": "0.0.0.0:0",
                                                 "SUBMISSION_PLAIN_AUTH": "on"})


def test_every_refusal_has_its_code_and_keeps_nothing(
        engine: sa.Engine, api: Api, token: str,
        start_submission: Callable[..., Running]) -> None:
    running = start_submission(SUBMISSION_MAX_SIZE="20000", SUBMISSION_MAX_RECIPIENTS="2")
    with running.client() as smtp:
        smtp.login("x", token)
        assert smtp.has_extn("size") and smtp.esmtp_features["size"] == "20000"
        assert smtp.has_extn("8bitmime") and smtp.has_extn("smtputf8")
        # Bad addresses.
        code, _ = smtp.mail("orders@shop.example.com")
        assert code == 250
        code, reply = smtp.rcpt("not an address")
        assert code in (501, 553), reply
        code, reply = smtp.rcpt("ann@example.org")
        assert code == 250
        code, reply = smtp.rcpt("bob@example.org")
        assert code == 250
        code, reply = smtp.rcpt("cid@example.org")
        assert code == 452 and b"4.5.3" in reply, reply  # too many recipients
        smtp.rset()
        # Oversize: announced, and sent anyway.
        code, reply = smtp.mail("orders@shop.example.com", ["SIZE=50000"])
        assert code == 552, reply
        smtp.mail("orders@shop.example.com")
        smtp.rcpt("ann@example.org")
        code, reply = smtp.data(raw_message(body=("x" * 70 + "\r\n") * 400))
        assert code == 552, reply
        # No kind, unknown kind, no From.
        no_kind = raw_message().replace(b"X-SendDock-Kind: receipt\r\n", b"")
        code, reply = submit(smtp, no_kind, ["ann@example.org"])
        assert code == 550 and b"X-SendDock-Kind" in reply, reply
        unknown = raw_message().replace(b"Kind: receipt", b"Kind: nosuch")
        code, reply = submit(smtp, unknown, ["ann@example.org"])
        assert code == 550 and b"receipt" in reply, reply  # names the known kinds
        no_from = raw_message().replace(b"From: Shop <orders@shop.example.com>\r\n", b"")
        code, reply = submit(smtp, no_from, ["ann@example.org"])
        assert code == 550 and b"From" in reply, reply
    # A From domain SendDock does not send for: the reply names the ones it does.
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO sending_domains (domain) VALUES ('mail.example.net')"))
    with running.client() as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw_message(), ["ann@example.org"])
        assert code == 550 and b"mail.example.net" in reply, reply
    assert jobs(engine) == []
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM smtp_messages")).scalar() == 0


def test_backlog_and_rate_limit_answer_temporary_errors(
        engine: sa.Engine, db_url: str, token: str,
        start_submission: Callable[..., Running]) -> None:
    full = start_submission(MAX_BACKLOG="1")
    with full.client() as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw_message(message_id="<b1@x>"), ["ann@example.org"])
        assert code == 250, reply
        code, reply = submit(smtp, raw_message(message_id="<b2@x>"), ["bob@example.org"])
        assert code == 452 and b"4.3.1" in reply, reply
    assert len(jobs(engine)) == 1
    limited = start_submission(SUBMISSION_RATE_LIMIT="1")
    with limited.client() as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw_message(message_id="<r1@x>"), ["cid@example.org"])
        assert code in (250, 452), reply
        code, reply = smtp.mail("orders@shop.example.com")
        assert code == 450 and b"4.7.1" in reply, reply


def test_suppressed_recipients_are_held_as_for_the_api(
        engine: sa.Engine, token: str, start_submission: Callable[..., Running]) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO suppressions (email, reason) "
                             "VALUES ('ann@example.org', 'complaint')"))
    running = start_submission()
    with running.client() as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw_message(), ["ann@example.org"])
    assert code == 250, reply
    (row,) = jobs(engine)
    with engine.connect() as conn:
        flags = conn.execute(sa.text("SELECT flags FROM delivery_jobs WHERE id = :id"),
                             {"id": row.id}).scalar_one()
    assert "suppressed" in flags


def _django_token_default_kind(engine: sa.Engine, token: str) -> None:
    from webapp.domain import submissions, users
    with engine.begin() as conn:
        token_id = users.user_for_token(conn, token)["token_id"]  # type: ignore[index]
        submissions.set_default_kind(conn, token_id, "receipt")


def test_django_with_a_token_default_kind(
        engine: sa.Engine, sink: Any, token: str,
        start_submission: Callable[..., Running]) -> None:
    django = pytest.importorskip("django", reason="pip install django (the dev extra)")
    from django.conf import settings as django_settings

    _django_token_default_kind(engine, token)
    running = start_submission()
    if not django_settings.configured:
        django_settings.configure(EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend")
    django.setup()
    from django.core.mail import EmailMessage as DjangoMessage
    from django.core.mail.backends.smtp import EmailBackend

    class Backend(EmailBackend):
        @property
        def ssl_context(self) -> ssl.SSLContext:
            return running.context()

    connection = Backend(host="127.0.0.1", port=running.port, username="django",
                         password=token, use_tls=True, timeout=30)
    from django.core.mail import send_mail
    assert send_mail("Hello", "Body ✓", "orders@shop.example.com", ["ann@example.org"],
                     connection=connection, fail_silently=False) == 1
    pdf = b"%PDF-1.4\n" + bytes(range(256)) * 40 + b"\n%%EOF\n"
    message = DjangoMessage("Invoice", "See attached.", "orders@shop.example.com",
                            ["bob@example.org"], connection=connection)
    message.attach("invoice.pdf", pdf, "application/pdf")
    assert message.send() == 1
    assert [r.email for r in jobs(engine)] == ["ann@example.org", "bob@example.org"]
    delivered = deliver(engine, running.config, sink, 2)
    invoice = next(m for m in delivered if b"Invoice" in m)
    parsed = message_from_bytes(invoice)
    (attachment,) = [p for p in parsed.walk() if p.get_filename() == "invoice.pdf"]
    assert attachment.get_payload(decode=True) == pdf


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: apt-get install -y swaks msmtp "
                    "libnet-ssleay-perl libio-socket-ssl-perl libauthen-sasl-perl "
                    "(.ci/system-packages)")
    return path


def test_swaks_starttls_auth(engine: sa.Engine, token: str, tmp_path: Path,
                             start_submission: Callable[..., Running]) -> None:
    swaks = _tool("swaks")
    running = start_submission()
    data = tmp_path / "m.eml"
    data.write_bytes(raw_message(message_id="<swaks@x>"))
    result = subprocess.run(
        [swaks, "--server", f"127.0.0.1:{running.port}", "--tls", "--auth", "PLAIN",
         "--auth-user", "swaks", "--auth-password", token, "--from",
         "orders@shop.example.com", "--to", "ann@example.org", "--data", str(data),
         "--timeout", "30"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "250 2.0.0 Queued as" in result.stdout
    assert len(jobs(engine)) == 1


def test_msmtp_starttls_and_implicit_tls(engine: sa.Engine, token: str, tmp_path: Path,
                                         start_submission: Callable[..., Running]) -> None:
    msmtp = _tool("msmtp")
    running = start_submission()
    for n, (port, starttls) in enumerate([(running.port, "on"), (running.tls_port, "off")]):
        result = subprocess.run(
            [msmtp, "--host=127.0.0.1", f"--port={port}", "--tls=on",
             f"--tls-starttls={starttls}", f"--tls-trust-file={running.ca}", "--auth=login",
             "--user=msmtp", "--passwordeval", f"echo {token}",
             "--from=orders@shop.example.com", "ann@example.org"],
            input=raw_message(message_id=f"<msmtp-{n}@x>"), capture_output=True,
            timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
    assert len(jobs(engine)) == 2


def test_the_stored_message_cannot_be_named_by_an_api_client(
        engine: sa.Engine, sink: Any, api: Api, token: str,
        start_submission: Callable[..., Running]) -> None:
    running = start_submission()
    with running.client() as smtp:
        smtp.login("x", token)
        code, _ = submit(smtp, raw_message(), ["ann@example.org"])
    assert code == 250
    stored = jobs(engine)[0].payload["data"]["smtp_message_id"]
    forged = api.post("/messages", {"kind": "receipt", "user_id": "u-9",
                                    "email": "eve@example.org",
                                    "data": {"smtp_message_id": stored,
                                             "smtp_signature": "0" * 32}})
    assert forged.status_code == 202, forged.get_json()
    pool = Pool(engine, running.config, node="smtp-forged")
    pool.start()
    try:
        wait_for(lambda: all(r.status in ("sent", "failed") for r in jobs(engine)),
                 message="both jobs finished")
    finally:
        pool.stop()
    assert {r.email: r.status for r in jobs(engine)} == {"ann@example.org": "sent",
                                                        "eve@example.org": "failed"}
    assert all(b"Receipt" not in m or b"eve@" not in m for m in sink.raw_messages())
    assert [r["rcpt_tos"][0] for r in sink.records()] == ["ann@example.org"]


def test_message_without_date_or_message_id_gets_them(
        engine: sa.Engine, sink: Any, token: str,
        start_submission: Callable[..., Running]) -> None:
    running = start_submission()
    raw = EmailMessage()
    raw["From"] = "orders@shop.example.com"
    raw["To"] = "zoë@example.org"
    raw["Subject"] = "UTF-8 address"
    raw["X-SendDock-Kind"] = "receipt"
    raw.set_content("Hallo")
    with running.client() as smtp:
        smtp.login("x", token)
        smtp.send_message(raw, mail_options=["SMTPUTF8"])
    (out,) = deliver(engine, running.config, sink, 1)
    assert b"Message-ID: <" in out and b"\nDate: " in out
    assert "zoë@example.org".encode() in out


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            return s.recv(64).startswith(b"220")
    except OSError:
        return False


def _submission_port() -> int:
    """A free port in this area's range (24000-24999), the same for the restarted process."""
    for port in range(24500, 25000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 24500-24999")


def test_postfix_smarthost_retries_after_senddock_is_killed_mid_data_one_copy(
        engine: sa.Engine, db_url: str, sink: Any, token: str, tmp_path: Path,
        certs: tuple[Path, Path, Path], spawn: Callable[..., Any]) -> None:
    """Postfix relays into SendDock (relayhost, SASL with the token, TLS required). The
    SendDock process is killed after the client sent the whole message and before the
    250 (its insert waits on a lock the test holds): nothing is kept, Postfix keeps the
    message and retries once SendDock is back, and the recipient gets exactly one copy."""
    reason = postfix_unavailable()
    if reason is not None:
        pytest.skip(reason)
    _ca, cert, key = certs
    port = _submission_port()
    values = settings(db_url, sink.port, SUBMISSION_LISTEN=f"127.0.0.1:{port}",
                      SUBMISSION_CERT=str(cert), SUBMISSION_KEY=str(key),
                      SUBMISSION_HOSTNAME="localhost", DB_LOCK_TIMEOUT="120",
                      DB_STATEMENT_TIMEOUT="120")
    first = spawn(["smtp"], values)
    wait_for(lambda: _listening(port), message="senddock smtp listening")
    relay = {"relayhost": f"[127.0.0.1]:{port}", "default_transport": "smtp",
             "relay_transport": "smtp", "smtp_sasl_auth_enable": "yes",
             "smtp_sasl_password_maps": f"static:postfix:{token}",
             "smtp_sasl_security_options": "noanonymous",
             "smtp_sasl_tls_security_options": "noanonymous",
             "smtp_tls_security_level": "encrypt", "minimal_backoff_time": "1s",
             "maximal_backoff_time": "2s", "queue_run_delay": "1s"}
    with postfix_running(main_cf=relay) as postfix:
        holder = engine.connect()
        try:
            holder.execute(sa.text("LOCK TABLE smtp_messages IN ACCESS EXCLUSIVE MODE"))
            with smtplib.SMTP("127.0.0.1", postfix.port, timeout=30) as smtp:
                smtp.sendmail("orders@shop.example.com", ["ann@example.org"],
                              raw_message(message_id="<postfix-1@shop.example.com>"))

            def waiting_insert() -> bool:
                with engine.connect() as conn:
                    return bool(conn.execute(sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%INSERT INTO smtp_messages%'")).scalar())

            wait_for(waiting_insert, message="SendDock's insert waiting after DATA")
            first.kill()  # mid-DATA: the message is received, the 250 not sent
        finally:
            holder.rollback()
            holder.close()
        wait_for(lambda: not waiting_insert(), message="the killed session's insert gone")
        assert jobs(engine) == []
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM smtp_messages")).scalar() == 0
        assert postfix.queue_size() == 1  # Postfix still holds it
        second = spawn(["smtp"], values)
        wait_for(lambda: _listening(port), message="senddock smtp listening again")
        wait_for(lambda: postfix.queue_size() == 0, message="Postfix's retry accepted")
        rows = jobs(engine)
        assert [r.email for r in rows] == ["ann@example.org"]
        second.terminate()
    delivered = deliver(engine, load(values), sink, 1)
    assert len(delivered) == 1
    assert b"Message-ID: <postfix-1@shop.example.com>" in delivered[0]


def test_serve_listens_when_set_and_a_cli_token_default_kind_applies(
        engine: sa.Engine, db_url: str, sink: Any, token: str, tmp_path: Path,
        certs: tuple[Path, Path, Path], make_user: Callable[..., dict[str, Any]],
        spawn: Callable[..., Any]) -> None:
    ca, cert, key = certs
    user = make_user("support")
    values = settings(db_url, sink.port, WORKERS="0")
    made = subprocess.run([sys.executable, "-m", "webapp", "token", "create", "--user",
                           user["email"], "--name", "cron", "--default-kind", "receipt"],
                          env=process_env(values), capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    cli_token = made.stdout.strip()
    alone = subprocess.run([sys.executable, "-m", "webapp", "smtp"], env=process_env(values),
                           capture_output=True, text=True, timeout=120)
    assert alone.returncode != 0 and "SENDDOCK_SUBMISSION_LISTEN" in alone.stderr
    port = _submission_port()
    spawn(["serve", "--port", str(free_port())], {
        **values, "SUBMISSION_LISTEN": f"127.0.0.1:{port}", "SUBMISSION_CERT": str(cert),
        "SUBMISSION_KEY": str(key), "SUBMISSION_HOSTNAME": "localhost"})
    wait_for(lambda: _listening(port), message="senddock serve's submission port")
    no_kind = raw_message(message_id="<cli@x>").replace(b"X-SendDock-Kind: receipt\r\n", b"")
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
        smtp.starttls(context=ssl.create_default_context(cafile=str(ca)))
        smtp.login(user["email"], cli_token)
        code, reply = submit(smtp, no_kind, ["ann@example.org"])
    assert code == 250, reply
    (row,) = jobs(engine)
    assert row.payload["data"]["source"]["token"] == "cron"


def test_retention_removes_a_stored_message_with_its_last_job(
        engine: sa.Engine, token: str, start_submission: Callable[..., Running]) -> None:
    from workers.delivery import retention

    running = start_submission()
    with running.client() as smtp:
        smtp.login("x", token)
        for n in (1, 2):
            code, reply = submit(smtp, raw_message(message_id=f"<old-{n}@x>"),
                                 ["ann@example.org"])
            assert code == 250, reply
    with engine.begin() as conn:  # both are old; the first one's job is finished
        conn.execute(sa.text("UPDATE smtp_messages SET created_at = created_at "
                             "- interval '400 days'"))
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = created_at "
                             "- interval '400 days', status = 'cancelled', finished_at = now() "
                             "WHERE true "
                             "AND payload -> 'data' -> 'source' ->> 'message_id' = '<old-1@x>'"))
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = created_at "
                             "- interval '400 days' WHERE payload -> 'data' -> 'source' "
                             "->> 'message_id' = '<old-2@x>'"))
    done = retention.Retention(engine, campaign_days=0, transactional_days=90).tick()
    assert done["transactional_rows"] == 1 and done["submitted_messages"] == 1
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT message_id FROM smtp_messages")).scalars().all()
    assert left == ["<old-2@x>"]  # its job still waits


def test_auth_guessing_is_locked_out_and_a_stalled_client_is_dropped(
        token: str, start_submission: Callable[..., Running]) -> None:
    running = start_submission(SUBMISSION_TIMEOUT="5")
    codes = []
    for _connection in range(3):
        with running.client() as smtp:
            smtp.ehlo()
            for _guess in range(4):
                code, _ = smtp.docmd("AUTH", "PLAIN " + base64.b64encode(
                    b"\0x\0sd_guess").decode())
                codes.append(code)
    assert codes[:10] == [535] * 10 and set(codes[10:]) == {454}
    with running.client() as smtp:  # the right token too, from that address, for now
        smtp.ehlo()
        code, reply = smtp.docmd("AUTH", "PLAIN " + base64.b64encode(
            f"\0x\0{token}".encode()).decode())
        assert code == 454, reply
    with socket.create_connection(("127.0.0.1", running.port), timeout=60) as stalled:
        assert stalled.recv(512).startswith(b"220")
        stalled.sendall(b"EHLO half-a-comm")  # and nothing more
        rest = b""
        while chunk := stalled.recv(512):
            rest += chunk
        # The loop ended: the server closed the connection (recv returned b"").
        assert not rest or rest.startswith(b"421"), rest


def _read_replies(sock: socket.socket) -> list[bytes]:
    """Every reply line the server sends until it closes the connection."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received.splitlines()


def test_connections_past_the_limit_get_421_and_are_closed(
        token: str, start_submission: Callable[..., Running]) -> None:
    running = start_submission(SUBMISSION_MAX_CONNECTIONS="3")
    held = [socket.create_connection(("127.0.0.1", running.port), timeout=30)
            for _ in range(2)]
    held.append(running.context().wrap_socket(
        socket.create_connection(("127.0.0.1", running.tls_port), timeout=30),
        server_hostname="localhost"))
    try:
        for sock in held:
            assert sock.recv(512).startswith(b"220")
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as excess:
            replies = _read_replies(excess)  # answered, then closed by the server
        assert len(replies) == 1 and replies[0].startswith(b"421 4.7.0"), replies
        with running.context().wrap_socket(socket.create_connection(
                ("127.0.0.1", running.tls_port), timeout=30),
                server_hostname="localhost") as excess_tls:
            assert _read_replies(excess_tls)[0].startswith(b"421 4.7.0")
        with running.client() as smtp:
            pass
    except smtplib.SMTPConnectError as exc:  # smtplib is refused too: the limit holds
        assert exc.smtp_code == 421
    else:
        raise AssertionError("a fourth connection was served")
    finally:
        held.pop().close()
    # One closed: the next connection is served (once the server has seen the close).
    wait_for(lambda: _greeted(running.port), message="a connection served again")
    with running.client() as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw_message(), ["ann@example.org"])
        assert code == 250, reply
    for sock in held:
        sock.close()
    assert running.server.handler.counts.get(("refused", "421"), 0) >= 3


def _greeted(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        return sock.recv(512).startswith(b"220")


def test_ten_thousand_recipients_are_refused_past_the_limit_and_the_server_answers_others(
        engine: sa.Engine, token: str, start_submission: Callable[..., Running]) -> None:
    running = start_submission()
    codes: dict[bytes, int] = {}
    with running.client() as smtp, running.client() as other:
        smtp.login("x", token)
        smtp.send(b"MAIL FROM:<orders@shop.example.com>\r\n")
        assert smtp.getreply()[0] == 250
        for batch in range(20):  # 10,000 RCPTs, pipelined 500 at a time
            smtp.send(b"".join(f"RCPT TO:<r{batch * 500 + n}@example.org>\r\n".encode()
                               for n in range(500)))
            for _ in range(500):
                code, reply = smtp.getreply()
                key = f"{code} ".encode() + reply[:5]
                codes[key] = codes.get(key, 0) + 1
            assert other.noop()[0] == 250  # another client is answered meanwhile
        code, reply = smtp.data(raw_message())
    assert codes == {b"250 2.1.5": 100, b"452 4.5.3": 9_900}, codes
    assert code == 250, reply
    # One job per accepted recipient; the reply line stays within RFC 5321's 512 octets.
    assert reply.endswith(b" and 99 more, one per recipient") and len(reply) < 508, reply
    assert len(jobs(engine)) == 100


def test_commands_pipelined_before_the_greeting_are_answered_in_order(
        engine: sa.Engine, token: str, start_submission: Callable[..., Running]) -> None:
    """A client that does not wait for the greeting (or for any reply) gets every reply in
    order and loses nothing."""
    running = start_submission(SUBMISSION_PLAIN_AUTH="on")
    auth = base64.b64encode(f"\0x\0{token}".encode())
    with socket.create_connection(("127.0.0.1", running.port), timeout=60) as sock:
        sock.sendall(b"EHLO early.example\r\nAUTH PLAIN " + auth + b"\r\n"
                     b"MAIL FROM:<orders@shop.example.com>\r\nRCPT TO:<ann@example.org>\r\n"
                     b"DATA\r\n" + raw_message() + b".\r\nQUIT\r\n")
        replies = [line for line in _read_replies(sock) if line[3:4] == b" "]
    assert [line[:3] for line in replies] == [
        b"220", b"250", b"235", b"250", b"250", b"354", b"250", b"221"], replies
    assert [r.email for r in jobs(engine)] == ["ann@example.org"]


def test_a_client_that_floods_without_reading_is_cut_off_by_count(
        start_submission: Callable[..., Running]) -> None:
    """100,000 commands of one name per connection at most (CALL_LIMITS): the server
    answers each (writing no faster than the client reads), then 421 and closes; other
    clients are answered meanwhile. (Before STARTTLS every command but EHLO, HELO,
    STARTTLS and QUIT is answered 530 and does not hold the connection open: the
    silence timeout runs on; the plain loopback port shows the count.)"""
    running = start_submission(SUBMISSION_PLAIN_AUTH="on")
    flood = b"RSET\r\n" * 110_000
    with socket.create_connection(("127.0.0.1", running.port), timeout=60) as sock:
        failed: list[BaseException] = []

        def send() -> None:
            try:
                sock.sendall(b"EHLO flood.example\r\n" + flood)
            except OSError as exc:  # the server closed the connection: expected
                failed.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        with running.client() as other:
            assert other.noop()[0] == 250
        replies = [line for line in _read_replies(sock) if line[3:4] == b" "]
        sender.join()
    assert replies[0].startswith(b"220") and replies[1].startswith(b"250")
    assert sum(r == b"250 OK" for r in replies) == 100_000, (len(replies), replies[-3:])
    assert replies[-1].startswith(b"421"), replies[-3:]


def test_auth_lockout_is_shared_by_two_submission_processes(
        engine: sa.Engine, db_url: str, sink: Any, token: str,
        spawn: Callable[..., Any]) -> None:
    """Failed AUTH is counted in PostgreSQL: guesses spread over two ``senddock smtp``
    processes lock the address out of both."""
    ports = []
    for _process in range(2):
        port = _submission_port()
        spawn(["smtp"], settings(db_url, sink.port, SUBMISSION_LISTEN=f"127.0.0.1:{port}",
                                 SUBMISSION_PLAIN_AUTH="on", SUBMISSION_HOSTNAME="localhost"))
        wait_for(lambda port=port: _listening(port), message="senddock smtp listening")
        ports.append(port)

    def guess(port: int, password: str) -> int:
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
            smtp.ehlo()
            code, _ = smtp.docmd("AUTH", "PLAIN " + base64.b64encode(
                f"\0x\0{password}".encode()).decode())
            return code

    codes = [guess(ports[n % 2], "sd_guess") for n in range(10)]  # 5 on each process
    assert codes == [535] * 10
    assert guess(ports[0], "sd_guess") == 454
    assert guess(ports[1], token) == 454  # the right token too, from that address, for now
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM smtp_auth_failures")).scalar() == 10


def test_metrics_count_sessions_and_replies_by_code(
        api: Api, token: str, make_user: Callable[..., dict[str, Any]],
        start_submission: Callable[..., Running]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    running = start_submission(SUBMISSION_MAX_RECIPIENTS="1")
    with running.client() as smtp:
        smtp.ehlo()
        assert smtp.docmd("AUTH", "PLAIN " + base64.b64encode(b"\0x\0sd_no").decode())[0] \
            == 535
        smtp.login("x", token)
        assert submit(smtp, raw_message(), ["ann@example.org"])[0] == 250
        smtp.mail("orders@shop.example.com")
        smtp.rcpt("ann@example.org")
        assert smtp.rcpt("bob@example.org")[0] == 452
    running.server.stop()  # the counts are added at stop (and every few seconds)
    response = api.client.get("/metrics", headers={
        "Authorization": f"Bearer {make_user('admin')['token']}"})
    assert response.status_code == 200
    family = next(f for f in text_string_to_metric_families(response.get_data(as_text=True))
                  if f.name == "senddock_smtp_replies")
    counted = {(s.labels["outcome"], s.labels["code"]): s.value for s in family.samples
               if s.name.endswith("_total")}
    assert counted == {("session", "220"): 1, ("auth_failed", "535"): 1,
                       ("accepted", "250"): 1, ("refused", "452"): 1}, counted


def test_submitted_mail_shows_its_source_and_admins_see_its_headers(
        app: Any, engine: sa.Engine, token: str, make_user: Callable[..., dict[str, Any]],
        start_submission: Callable[..., Running]) -> None:
    from tests.helpers import Browser, place_jobs

    running = start_submission()
    with running.client() as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw_message(
            extra="X-Note: <script>alert(1)</script>\r\n"), ["ann@example.org"])
    assert code == 250, reply
    (job,) = jobs(engine)
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'failed', "
                                 "finished_at = now(), last_error = '550 5.1.1 no such user' "
                                 "WHERE id = :id"), {"id": job.id})
    stored = job.payload["data"]["smtp_message_id"]
    headers_url = f"/admin/submitted/{stored}/headers"
    admin = Browser(app.test_client(), make_user("admin"))
    support = Browser(app.test_client(), make_user("support"))
    for browser in (admin, support):
        for path in ("/support/users/u-42", f"/inbox/{job.id}"):
            page = browser.get(path).get_data(as_text=True)
            assert 'class="job-source"' in page and "<strong>tests</strong>" in page \
                and "<code>127.0.0.1</code>" in page
            assert "&lt;m1@shop.example.com&gt;" in page
            assert (headers_url in page) == (browser is admin), path
        assert "SMTP</span>" in browser.get("/inbox/").get_data(as_text=True)
    response = admin.get(headers_url)
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    assert "X-SendDock-Kind: receipt" in page and "Bcc: secret@example.org" in page
    assert "X-Note: &lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "your receipt" not in page  # headers only
    spanish = admin.get(headers_url, headers={"Accept-Language": "es"}).get_data(as_text=True)
    assert "Cabeceras" in spanish and "Dirección del cliente" in spanish
    assert support.get(headers_url).status_code == 403
    assert admin.get("/admin/submitted/999999/headers").status_code == 404


def test_a_large_message_is_streamed_to_the_database_and_stored_byte_for_byte(
        engine: sa.Engine, token: str, start_submission: Callable[..., Running]) -> None:
    """Past one chunk (1 MB) the message goes from the spool file to PostgreSQL by COPY:
    its bytes, dot-stuffed lines and a Message-ID with COPY's special characters come
    back exactly."""
    running = start_submission()
    line = b".leading dot and 8-bit \xc3\xa9 " + b"x" * 60 + b"\r\n"
    body = b"".join(line for _ in range(40_000))  # about 3.6 MB
    raw = raw_message(message_id="<big\\one\tx@shop.example.com>").replace(
        "Grüße — your receipt.\r\n".encode(), b"") + body
    with running.client() as smtp:
        smtp.login("x", token)
        code, reply = submit(smtp, raw, ["ann@example.org"])
    assert code == 250, reply
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT message_id, client, size, raw FROM smtp_messages")).one()
    assert row.message_id == "<big\\one\tx@shop.example.com>"
    assert row.client == "127.0.0.1" and row.size == len(raw) > 3_000_000
    assert bytes(row.raw) == raw
