"""``senddock check`` against a private Postfix and a local DNS server: every problem the
tests create is named on its own line with what to do, and the exit status says whether
there was one."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from harness import postfix
from harness.dns import DnsServer
from tests.conftest import ROOT, free_port, process_env, settings
from webapp.checks import format_line, run_checks
from webapp.domain.domain_checks import OK, PROBLEM, WARNING, Check
from workers.building import dkim
from workers.core.settings import Config

SECRET = "test-secret-key-not-for-production"
pytestmark = pytest.mark.slow


def senddock_check(values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webapp", "check"], capture_output=True,
                          text=True, env=process_env(values), cwd=ROOT, timeout=120)


def ready_domain(engine: sa.Engine, dns_server: DnsServer, domain: str = "example.com") -> None:
    with engine.begin() as conn:
        key = dkim.create_key(conn, SECRET, domain)
    zone = dns_server.zone
    zone.txt(domain, "v=spf1 ip4:127.0.0.1 -all")
    zone.txt(key.record_name, key.record_value)
    zone.txt(f"_dmarc.{domain}", "v=DMARC1; p=reject")
    zone.add(domain, "MX", f"mx.{domain}")


def named(checks: list[Check], name: str) -> Check:
    found = [c for c in checks if c.name == name]
    assert len(found) == 1, [format_line(c) for c in checks]
    return found[0]


def values_for(db_url: str, relay: postfix.Postfix, dns_server: DnsServer,
               **overrides: str) -> dict[str, str]:
    base = settings(db_url, SMTP_URL=relay.smtp_url(postfix.USER, postfix.PASSWORD,
                                                    tls="starttls", verify="false"),
                    DNS_RESOLVER=dns_server.resolver_setting,
                    BOUNCE_ADDRESS="bounces@example.com")
    base.update(overrides)
    return base


def test_a_ready_installation_exits_zero(engine: sa.Engine, db_url: str,
                                         relay: postfix.Postfix,
                                         dns_server: DnsServer) -> None:
    ready_domain(engine, dns_server)
    result = senddock_check(values_for(
        db_url, relay, dns_server, SMTP_HELO="sender.senddock.test",
        SMTP_CA_FILE=str(relay.ca_file),
        SMTP_URL=relay.smtp_url(postfix.USER, postfix.PASSWORD, tls="starttls")))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert all(line.split()[0] == OK for line in lines), lines
    text = result.stdout
    assert "ok       database: reachable" in text
    assert "ok       migrations: current" in text
    assert f"ok       relay login: logged in as {postfix.USER} with CRAM-MD5, one" in text
    assert "ok       relay EHLO: the relay accepted EHLO sender.senddock.test" in text
    assert re.search(r"ok       relay TLS: TLSv1\.[23] with certificate \S+, valid until", text)
    assert "ok       relay MAIL FROM: the relay accepts the envelope sender bounces@" in text
    assert "ok       DKIM key sd1._domainkey.example.com" in text
    assert "ok       SPF of example.com" in text
    assert "ok       MX of example.com: bounces reach mx.example.com." in text
    assert "ok       bounce address: bounces@example.com" in text
    # What Postfix saw: EHLO, STARTTLS, one AUTH, MAIL then RSET, and no mail queued.
    log = "\n".join(relay.log())
    assert "ehlo=2 starttls=1 auth=1 mail=1 rcpt=1 rset=1" in log, log
    assert relay.queue_size() == 0 and not relay.messages()


def test_problems_exit_non_zero_each_on_its_line(engine: sa.Engine, db_url: str,
                                                 relay: postfix.Postfix,
                                                 dns_server: DnsServer) -> None:
    """No DNS records, a wrong password: a line for each, and exit status 1."""
    with engine.begin() as conn:
        dkim.create_key(conn, SECRET, "example.com")
    result = senddock_check(values_for(
        db_url, relay, dns_server,
        SMTP_URL=relay.smtp_url(postfix.USER, "wrong", tls="starttls", verify="false")))
    assert result.returncode == 1
    problems = [line for line in result.stdout.splitlines() if line.startswith(PROBLEM)]
    assert any(line.startswith("problem  relay login: the relay refused our login") and
               "535" in line and "-> check the user and password" in line
               for line in problems), problems
    assert any("no SPF record" in line for line in problems)
    assert any("no DKIM record is published at sd1._domainkey.example.com" in line and
               "IN TXT" in line for line in problems)
    assert any("no DMARC record" in line for line in problems)


def test_database_unreachable_and_not_migrated(db_url: str, config_for: Callable[..., Config],
                                               pg_server: str) -> None:
    port = free_port()
    down = run_checks(config_for(DATABASE_URL=f"postgresql://postgres@127.0.0.1:{port}/x"))
    assert named(down, "database").status == PROBLEM
    assert "SENDDOCK_DATABASE_URL" in (named(down, "database").fix or "")
    import psycopg

    empty = f"senddock_empty_{port}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{empty}"')  # type: ignore[arg-type]
    try:
        url = sa.make_url(db_url).set(database=empty).render_as_string(hide_password=False)
        checks = run_checks(config_for(DATABASE_URL=url, SMTP_URL=f"smtp://127.0.0.1:{port}"))
        assert named(checks, "migrations").status == PROBLEM
        assert named(checks, "migrations").fix == "run senddock db upgrade"
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{empty}" WITH (FORCE)')  # type: ignore[arg-type]


def relay_checks(config_for: Callable[..., Config], relay: postfix.Postfix,
                 dns_server: DnsServer, url: str, **overrides: str) -> list[Check]:
    from webapp.checks import relay_checks as checks

    return checks(config_for(SMTP_URL=url, DNS_RESOLVER=dns_server.resolver_setting,
                             BOUNCE_ADDRESS="bounces@example.com", **overrides))


def test_relay_problems(relay: postfix.Postfix, dns_server: DnsServer,
                        config_for: Callable[..., Config]) -> None:
    nothing = relay_checks(config_for, relay, dns_server, f"smtp://127.0.0.1:{free_port()}")
    assert named(nothing, "relay connection").status == PROBLEM

    unverified = relay_checks(config_for, relay, dns_server,
                              relay.smtp_url(tls="starttls"))  # private CA, not trusted
    tls = named(unverified, "relay TLS")
    assert tls.status == PROBLEM and "certificate" in tls.verdict.lower()
    assert "SENDDOCK_SMTP_CA_FILE" in (tls.fix or "")

    clear = relay_checks(config_for, relay, dns_server,
                         relay.smtp_url(postfix.USER, postfix.PASSWORD, tls="none"))
    plain = named(clear, "relay TLS")
    assert plain.status == PROBLEM and "password travel in clear" in plain.verdict
    assert plain.fix == "add ?tls=starttls to SENDDOCK_SMTP_URL"

    relay.write_map("sender_access", {"bounces@example.com": "554 5.7.1 not your address"})
    delayed = relay_checks(config_for, relay, dns_server, relay.smtp_url())  # Postfix default
    rcpt = named(delayed, "relay RCPT TO")
    assert rcpt.status == PROBLEM and "Sender address rejected" in rcpt.verdict, rcpt
    relay.configure(smtpd_delay_reject="no")
    refused = relay_checks(config_for, relay, dns_server, relay.smtp_url())
    mail = named(refused, "relay MAIL FROM")
    assert mail.status == PROBLEM and "554" in mail.verdict and "not your address" in mail.verdict
    assert named(refused, "relay EHLO").ok

    relay.write_map("sender_access", {})
    relay.write_map("helo_access", {"check.senddock.test": "554 5.7.1 bad helo"})
    assert named(relay_checks(config_for, relay, dns_server, relay.smtp_url(),
                              SMTP_HELO="other.senddock.test"), "relay EHLO").ok
    helo = relay_checks(config_for, relay, dns_server, relay.smtp_url(),
                        SMTP_HELO="check.senddock.test")
    assert [c.status for c in helo if c.name.startswith("relay")][-1] == PROBLEM
    assert "bad helo" in helo[-1].verdict and "SENDDOCK_SMTP_HELO" in (helo[-1].fix or "")


def test_a_key_the_secret_key_cannot_open(engine: sa.Engine, db_url: str, sink: Any,
                                          dns_server: DnsServer,
                                          config_for: Callable[..., Config]) -> None:
    ready_domain(engine, dns_server)
    checks = run_checks(config_for(sink.port, SECRET_KEY="a different secret",
                                   DNS_RESOLVER=dns_server.resolver_setting))
    key = named(checks, "DKIM key")
    assert key.status == PROBLEM and "SENDDOCK_SECRET_KEY" in key.verdict
    assert named(checks, "bounce address").status == WARNING
    unset = run_checks(config_for(sink.port, SECRET_KEY="",
                                  DNS_RESOLVER=dns_server.resolver_setting))
    assert named(unset, "secret key").status == PROBLEM
    assert not [c for c in unset if c.name == "DKIM key"]  # not blamed on the keys


def test_dkim_create_activate_and_list_commands(engine: sa.Engine, db_url: str) -> None:
    from click.testing import CliRunner

    from webapp.cli import main

    env = {f"SENDDOCK_{k}": v for k, v in settings(db_url).items()}

    def senddock(*args: str) -> Any:
        return CliRunner().invoke(main, ["dkim", *args], env=env)

    made = senddock("create", "Example.com")
    assert made.exit_code == 0, made.output
    with engine.connect() as conn:
        (key,) = dkim.list_keys(conn, "example.com")
    assert made.stdout.strip() == key.zone_line  # the record alone on stdout
    assert "publish this TXT record at sd1._domainkey.example.com" in made.stderr
    ed = senddock("create", "example.com", "--algorithm", "ed25519", "--selector", "ed2026")
    assert ed.exit_code == 0 and "k=ed25519" in ed.stdout
    nxt = senddock("create", "example.com")
    assert nxt.exit_code == 0 and "(rsa, next)" in nxt.stderr
    assert senddock("activate", "example.com", "sd2").exit_code == 0
    listed = senddock("list").stdout.splitlines()
    assert [line.split()[:2] for line in listed] == [
        ["active", "ed25519"], ["active", "rsa"], ["retired", "rsa"]]
    bad = senddock("create", "not a domain")
    assert bad.exit_code != 0 and "not a valid domain name" in bad.output
