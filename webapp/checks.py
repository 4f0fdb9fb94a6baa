"""``senddock check``: is this installation ready to send? (docs/design.md §25)

The database (reachable, migrations current), the relay (connect, EHLO with the configured
name, STARTTLS and its certificate, AUTH, MAIL FROM accepted), the DKIM keys and the DNS
records of every sending domain, and the bounce address. Each check is a
:class:`~webapp.domain.domain_checks.Check`: one line, ok / warning / problem, and what to
do. Nothing here changes anything: no migration is applied, no mail is sent (MAIL FROM and
RCPT TO postmaster@ are followed by RSET).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from email.utils import parseaddr
from typing import Any

import sqlalchemy as sa

from webapp import db
from webapp.domain import domain_checks as dc
from webapp.domain.domain_checks import OK, PROBLEM, WARNING, Check
from workers.building import dkim
from workers.core.addresses import domain_of
from workers.core.relays import RelaySpec, parse_relays
from workers.core.settings import Config
from workers.core.states import Campaign, sql_list
from workers.delivery.classify import ReplyClass
from workers.delivery.smtp import AUTH_PREFERENCE, SmtpTransport


def run_checks(config: Config) -> list[Check]:
    """Every check, in the order a person fixes things: database, relay, domains."""
    checks: list[Check] = []
    if config.secret_key_generated:
        checks.append(Check("secret key", PROBLEM, "SENDDOCK_SECRET_KEY is not set: serve, "
                            "web and worker refuse to start, and the DKIM keys cannot be "
                            "decrypted.", "set SENDDOCK_SECRET_KEY to the value serve and "
                            "worker use"))
    engine = None
    try:
        checks_db, engine = database_checks(config)
        checks.extend(checks_db)
        checks.extend(relay_checks(config))
        checks.extend(domain_report_checks(config, engine))
    finally:
        if engine is not None:
            engine.dispose()
    return checks


# -- database --------------------------------------------------------------------------


def database_checks(config: Config) -> tuple[list[Check], Any]:
    """(checks, engine): the engine is None when the database cannot be reached."""
    if not config.database_url:
        return [Check("database", PROBLEM, "SENDDOCK_DATABASE_URL is not set (the embedded "
                      "PostgreSQL is for the demo).", "set SENDDOCK_DATABASE_URL to your "
                      "PostgreSQL (postgresql://user:password@host:5432/db)")], None
    from workers.core import pg

    try:
        url = db.normalize_url(config.database_url)
        engine = db.make_engine(url, pool_size=1, app_name="senddock-check")
        with engine.connect() as conn:
            version = conn.execute(sa.text("SHOW server_version")).scalar()
            current = set(conn.execute(sa.text(
                "SELECT version_num FROM alembic_version")).scalars()) if conn.execute(
                sa.text("SELECT to_regclass('alembic_version')")).scalar() else set()
    except (sa.exc.SQLAlchemyError, ValueError) as exc:
        problem = pg.classify(exc)
        words = problem.message if problem else pg.first_line(exc)
        return [Check("database", PROBLEM, f"cannot use the database: {words} "
                      f"({pg.first_line(exc)})", "check SENDDOCK_DATABASE_URL, that PostgreSQL "
                      "runs and accepts this user")], None
    checks = [Check("database", OK, f"reachable (PostgreSQL {version}).")]
    heads = set(_script_heads(url))
    if current == heads:
        checks.append(Check("migrations", OK, f"current (revision {', '.join(sorted(heads))})."))
    elif not current:
        checks.append(Check("migrations", PROBLEM, "the database has no SendDock schema.",
                            "run senddock db upgrade"))
    else:
        checks.append(Check("migrations", PROBLEM, f"the database is at revision "
                            f"{', '.join(sorted(current))}, this SendDock expects "
                            f"{', '.join(sorted(heads))}.", "run senddock db upgrade"))
    return checks, engine


def _script_heads(url: str) -> list[str]:
    from alembic.script import ScriptDirectory

    return list(ScriptDirectory.from_config(db.alembic_config(url)).get_heads())


# -- relay -----------------------------------------------------------------------------


def make_transport(config: Config, relay: RelaySpec | None = None) -> SmtpTransport:
    """The transport the delivery pool uses (workers.delivery.pool), with the same settings: EHLO
    name, CA file, one AUTH mechanism; to ``relay`` (default: the first of SMTP_URL)."""
    relay = relay or parse_relays(config.smtp_url)[0]
    return SmtpTransport(relay.smtp, timeout=config.smtp_timeout,
                         local_hostname=config.smtp_helo, ca_file=config.smtp_ca_file)


_STAGE_WORDS = {
    "connect": ("relay connection", "cannot connect to the relay",
                "check the host and port in SENDDOCK_SMTP_URL and that the relay runs"),
    "greeting": ("relay greeting", "the relay refused the connection at its greeting",
                 "ask the relay's administrator whether this host may connect"),
    "ehlo": ("relay EHLO", "the relay refused our EHLO",
             "set SENDDOCK_SMTP_HELO to this host's public name"),
    "starttls": ("relay TLS", "TLS with the relay failed",
                 "check the relay's certificate; for a private CA set SENDDOCK_SMTP_CA_FILE"),
    "auth": ("relay login", "the relay refused our login",
             "check the user and password in SENDDOCK_SMTP_URL"),
    "mail": ("relay MAIL FROM", "the relay refuses our envelope sender",
             "let this login send as that address, or change SENDDOCK_BOUNCE_ADDRESS / "
             "SENDDOCK_FROM"),
    # Postfix reports sender, HELO and client refusals at RCPT by default
    # (smtpd_delay_reject): RCPT TO postmaster@ (which every domain must accept) finds them.
    "rcpt": ("relay RCPT TO", "the relay refuses mail from us at RCPT TO postmaster@ (its "
             "reply names the reason: our sender, HELO or address)",
             "fix what the reply names: the sender (SENDDOCK_BOUNCE_ADDRESS / SENDDOCK_FROM), "
             "the EHLO name (SENDDOCK_SMTP_HELO) or this host's permission to relay"),
}


def envelope_sender(config: Config) -> str:
    return config.feedback.bounce_address or parseaddr(config.mail_from)[1]


def relay_checks(config: Config) -> list[Check]:
    """Connect, EHLO, STARTTLS and the certificate, AUTH, MAIL FROM: one line per step up
    to the first that fails, for each relay of SENDDOCK_SMTP_URL (docs/design.md §17; with several,
    each line names its relay and role)."""
    try:
        relays = parse_relays(config.smtp_url)
    except ValueError as exc:
        return [Check("relay", PROBLEM, f"SENDDOCK_SMTP_URL: {exc}", "fix SENDDOCK_SMTP_URL")]
    if len(relays) == 1:
        return _one_relay(config, make_transport(config, relays[0]))
    return [Check(f"{c.name} ({r.name}, {r.role})", c.status, c.verdict, c.fix)
            for r in relays for c in _one_relay(config, make_transport(config, r))]


def _one_relay(config: Config, transport: SmtpTransport) -> list[Check]:
    smtp_config = transport.config
    sender = envelope_sender(config)
    probe_recipient = f"postmaster@{sender.rpartition('@')[2]}"
    with transport:
        result = transport.probe(sender, probe_recipient)
        session = transport.session
        if result.reply_class is ReplyClass.SENT and session is not None:
            return _relay_ok(smtp_config.redacted(), transport, session, sender)
    order = list(_STAGE_WORDS)
    stage = result.stage if result.stage in _STAGE_WORDS else "rcpt"
    checks = [Check(_STAGE_WORDS[s][0], OK, "passed.") for s in order[:order.index(stage)]
              if s != "greeting" and (s != "starttls" or smtp_config.tls != "none")
              and (s != "auth" or smtp_config.username)]
    name, words, fix = _STAGE_WORDS[stage]
    reply = f"{result.code} {result.text}".strip() if result.code else result.text
    checks.append(Check(name, PROBLEM, f"{words} ({smtp_config.redacted()}): {reply}", fix))
    return checks


def _relay_ok(where: str, transport: SmtpTransport, session: Any, sender: str) -> list[Check]:
    config = transport.config
    helo = getattr(session, "local_hostname", "?")
    checks = [Check("relay connection", OK, f"connected to {where}."),
              Check("relay EHLO", OK, f"the relay accepted EHLO {helo}.")]
    sock = session.sock
    if isinstance(sock, ssl.SSLSocket):
        cert = sock.getpeercert() or {}
        names: list[Any] = [pair for rdn in cert.get("subject", ()) for pair in rdn]
        who = next((str(pair[1]) for pair in names if pair[0] == "commonName"),
                   "not verified (verify=false)")
        checks.append(Check("relay TLS", OK if cert else WARNING,
                            f"{sock.version()} with certificate {who}" + (
                                f", valid until {cert['notAfter']}." if cert else "."),
                            None if cert else "remove verify=false from SENDDOCK_SMTP_URL "
                            "(trust a private CA with SENDDOCK_SMTP_CA_FILE)"))
    elif "starttls" in session.esmtp_features:
        checks.append(Check("relay TLS", PROBLEM if config.username else WARNING,
                            "the relay offers STARTTLS but SENDDOCK_SMTP_URL says tls=none: "
                            "mail" + (" and the password" if config.username else "")
                            + " travel in clear.", "add ?tls=starttls to SENDDOCK_SMTP_URL"))
    else:
        checks.append(Check("relay TLS", WARNING, "no TLS: the relay offers no STARTTLS.",
                            "use TLS unless the relay is on this host"))
    if config.username:
        offered = session.esmtp_features.get("auth", "").upper().split()
        used = next((m for m in AUTH_PREFERENCE if m in offered), "AUTH")
        checks.append(Check("relay login", OK, f"logged in as {config.username} with {used}, "
                            f"one attempt (the relay offers {' '.join(offered)})."))
    checks.append(Check("relay MAIL FROM", OK, f"the relay accepts the envelope sender "
                        f"{sender} (MAIL FROM and RCPT TO postmaster@, then RSET)."))
    return checks


# -- sending domains -------------------------------------------------------------------


def sending_domains(conn: Any, config: Config) -> list[str]:
    """The domains mail is sent From: SENDDOCK_FROM's, every domain with a key, and the
    From domains of campaigns not yet finished."""
    domains = [domain_of(config.mail_from)]
    domains += conn.execute(sa.text("SELECT domain FROM sending_domains ORDER BY domain"))\
        .scalars().all()
    for from_addr in conn.execute(sa.text(
            "SELECT DISTINCT from_addr FROM campaigns WHERE status IN "
            f"{sql_list(Campaign.OPEN)}")).scalars():
        domains.append(domain_of(from_addr))
    return [d for d in dict.fromkeys(domains) if d]


def domain_report_checks(config: Config, engine: Any) -> Iterator[Check]:
    """The DKIM keys (each decrypts with the secret key) and each sending domain's DNS."""
    if engine is None:
        return
    try:
        resolver = dc.make_resolver(config.dns_resolver)
    except ValueError as exc:
        yield Check("DNS", PROBLEM, str(exc), "fix SENDDOCK_DNS_RESOLVER")
        return
    errors: list[str] = []
    with engine.connect() as conn:
        try:
            keys = dkim.list_keys(conn)
            if not config.secret_key_generated:  # a random key opens nothing: said above
                dkim.load_signing_keys(conn, config.secret_key, errors)
            domains = sending_domains(conn, config)
        except sa.exc.ProgrammingError:  # no schema: the migrations line said so
            return
    for error in errors:
        yield Check("DKIM key", PROBLEM, error, "restore the secret key, or create a new key "
                    "(senddock dkim create DOMAIN) and publish it")
    bounce = config.feedback.bounce_address
    relay_host = parse_relays(config.smtp_url)[0].smtp.host
    for domain in domains:
        report = dc.check_domain(resolver, domain, keys, relay_host=relay_host,
                                 bounce_address=bounce or f"{envelope_sender(config)}",
                                 spf_include=config.spf_include)
        yield from report.checks
    if bounce:
        yield Check("bounce address", OK, f"{bounce}: the envelope sender is "
                    f"{bounce.replace('@', '+<job token>@')}, so each bounce finds its job.")
    else:
        yield Check("bounce address", WARNING, "SENDDOCK_BOUNCE_ADDRESS is not set: bounces go "
                    "to the From address and SendDock does not match them to messages.",
                    "set SENDDOCK_BOUNCE_ADDRESS to a mailbox on your domain, e.g. "
                    f"bounces@{domains[0] if domains else 'example.com'}")


def format_line(check: Check) -> str:
    """One line: ``problem  name: verdict -> what to do``."""
    line = f"{check.status:<8} {check.name}: {check.verdict}"
    return f"{line} -> {check.fix}" if check.fix and check.status != OK else line
