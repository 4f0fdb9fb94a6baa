"""Every ``SENDDOCK_*`` setting in one place, with its default and a line of help.

The table in ``docs/configuration.md`` is generated from :data:`SETTINGS`
(``senddock config --write docs/configuration.md``) and a test compares the two.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.core.outgoing import Guard
from workers.core.relays import parse_relays


class ConfigError(Exception):
    """A setting has a value SendDock cannot use; the message names the variable."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None
    help: str


SETTINGS: list[Setting] = [
    Setting("DATABASE_URL", None,
            "PostgreSQL URL as libpq reads it (postgresql://user:pass@host:5432/db; with a "
            "standby: postgresql://user:pass@h1:5432,h2:5432/db?target_session_attrs="
            "read-write). Unset: an embedded PostgreSQL is started in SENDDOCK_DATA_DIR."),
    Setting("DATA_DIR", "./.senddock",
            "Where the embedded PostgreSQL and the demo keep their files."),
    Setting("SMTP_URL", "smtp://127.0.0.1:2525?tls=none",
            "Relay: smtp://[user:password@]host:port[?tls=none|starttls|ssl]. Several "
            "relays: URLs separated by commas or spaces, each with an optional role= (all, "
            "transactional or campaign: the stream it carries first; every relay is the "
            "others' failover, in the order given) and name= (docs/configuration.md)."),
    Setting("FROM", "SendDock <noreply@localhost>", "Default From address."),
    Setting("BASE_URL", "http://127.0.0.1:5000",
            "Public URL of the web app, used in unsubscribe and verification links."),
    Setting("SECRET_KEY", None,
            "Signs sessions, CSRF tokens and unsubscribe links. Required by serve, web and "
            "worker (the demo keeps one in its data dir)."),
    Setting("WORKERS", "5", "Delivery worker threads per process."),
    Setting("OIDC_ISSUER", None,
            "Single sign-on: the OpenID provider's issuer URL (its /.well-known/openid-"
            "configuration is read). Unset: no single sign-on."),
    Setting("OIDC_CLIENT_ID", None, "Single sign-on: SendDock's client id at the provider."),
    Setting("OIDC_CLIENT_SECRET", None,
            "Single sign-on: SendDock's client secret at the provider."),
    Setting("OIDC_ROLE_CLAIM", "groups",
            "Single sign-on: the ID token claim (a string or a list) the role is read from."),
    Setting("OIDC_ROLE_MAP", "",
            "Single sign-on: claim value=role pairs separated by commas (e.g. "
            "senddock-admins=admin,marketing=marketer); the first pair whose value the "
            "claim holds gives the role. No pair matches: the sign-in is refused."),
    Setting("OIDC_CREATE_USERS", "off",
            "Single sign-on: on = a first sign-in creates the SendDock user (with the mapped "
            "role); off = only existing users may sign in."),
    Setting("SSO_ONLY_DOMAINS", "",
            "Email domains (comma-separated) whose users must sign in through the identity "
            "provider: the password form refuses them."),
    Setting("STEP_UP_MINUTES", "15",
            "A user with a second factor is asked for a code again before creating a token, "
            "changing a role or exporting a list when their last check is older than this."),
    Setting("CLAIM_BATCH", "10",
            "Jobs a worker claims at once (their outcomes are committed one by one)."),
    Setting("RETRY_SCHEDULE_BROADCAST", "30,120,480,1800,3600",
            "Seconds between attempts for campaign mail (comma-separated)."),
    Setting("RETRY_SCHEDULE_VERIFY", "30,120,600",
            "Seconds between attempts for verification mail."),
    Setting("RETRY_JITTER", "0.1", "Random spread applied to retry delays (0.1 = ±10 %)."),
    Setting("RESEND_COOLDOWN", "60",
            "Seconds a verification resend must wait after the last one."),
    Setting("RATE_LIMIT", "0",
            "Messages per second across all processes and hosts, on the database's clock "
            "(0 = no limit; fractions allowed: 0.5 = one message every 2 s)."),
    Setting("RATE_LIMIT_HOUR", "0",
            "Most messages in any rolling 60 minutes, across all processes (0 = no limit)."),
    Setting("RATE_LIMIT_DAY", "0",
            "Most messages in any rolling 24 hours, across all processes (0 = no limit; "
            "SES's daily sending quota)."),
    Setting("HEARTBEAT_INTERVAL", "5",
            "Seconds between worker heartbeats; each renews the worker's lease."),
    Setting("WORKER_TIMEOUT", "30",
            "The lease: seconds a worker's right to send runs from each renewal, on the "
            "database's clock (docs/design.md §15). A worker whose lease expired sends nothing "
            "more."),
    Setting("LEASE_GRACE", "10",
            "Seconds after a worker's lease expired before its jobs are taken back by a "
            "peer (a dead host's jobs: within WORKER_TIMEOUT + LEASE_GRACE + 10 s)."),
    Setting("LEASE_MARGIN", "10",
            "Fencing: a worker starts a message (MAIL FROM, and again at the relay's 354) only "
            "while its lease was confirmed within WORKER_TIMEOUT minus this many seconds by "
            "its own clock; it covers the SMTP transaction. At most half of WORKER_TIMEOUT "
            "minus HEARTBEAT_INTERVAL (a larger value is cut to that)."),
    Setting("SMTP_TIMEOUT", "30", "Seconds before an SMTP command is given up on."),
    Setting("SMTP_HELO", None,
            "The name SendDock gives in EHLO (default: this host's FQDN; an address literal "
            "such as [192.0.2.1] when the host has no dotted name, never 'localhost')."),
    Setting("SMTP_CA_FILE", None,
            "A PEM file of CA certificates to trust for the relay's TLS certificate, in "
            "addition to the system's (a private CA)."),
    Setting("SMTP_MAX_MESSAGES", "100",
            "Messages sent over one kept-open relay connection before it is closed and "
            "reopened (Postfix's own client: 100)."),
    Setting("SMTP_MAX_AGE", "300",
            "Seconds a kept-open relay connection is used before it is closed and reopened "
            "(so a relay's reload or changed limits are seen)."),
    Setting("THROTTLE_BACKOFF", "30,60,120,300,900",
            "Seconds a recipient domain that throttles us waits after successive throttling "
            "replies (Gmail 4.7.28, Outlook 4.7.650...), and the relay after it closed the "
            "channel (421); a step further only when the first try after the wait is "
            "throttled again. A relay that throttles at RCPT is paced instead (its rate "
            "halved, grown back while it accepts). No attempt is used."),
    Setting("RELAY_PROBE_MAX", "60",
            "Longest wait in seconds between probes of a relay that is down (the probes "
            "back off 2, 4, 8 ... s up to this)."),
    Setting("LOGIN_PROBE_INTERVAL", "300",
            "After the relay refused our login (535), probe it at most this often in seconds "
            "(a fail2ban jail must never ban us); an admin's Retry now probes at once."),
    Setting("SAME_REFUSAL_STREAK", "10",
            "The same refusal for this many different recipients in a row is treated as "
            "about us (delivery pauses), whatever its text says (0 = off)."),
    Setting("MAX_BACKLOG", "5000000",
            "Most transactional jobs waiting (pending+retry) before new ones are refused "
            "with 503; campaign jobs do not count (a campaign's list bounds it)."),
    Setting("RETENTION_CAMPAIGN_DAYS", "30",
            "Days after a campaign finished before it is rolled up: its counts stay exact, "
            "its failed and bounced jobs stay, the other per-recipient rows are deleted "
            "(0 = keep them forever)."),
    Setting("RETENTION_TRANSACTIONAL_DAYS", "90",
            "Days a finished transactional job (verification, test, other kinds) is kept; "
            "its kind's counts stay exact (0 = keep them forever)."),
    Setting("DISPOSABLE_POLICY", "send",
            "send: send disposable-domain verification mail, flagged; hold: hold it for support."),
    Setting("ALARM_OLDEST_PENDING", "600",
            "Alarm when the oldest due job waited this many seconds."),
    Setting("ALARM_FAILURE_RATE", "0.2",
            "Alarm when this share of the last 15 minutes' finished jobs failed or bounced."),
    Setting("MAX_REQUEST_BYTES", "10485760",
            "Largest request body accepted anywhere but the CSV import (10 MiB; above it "
            "413, as JSON on the API)."),
    Setting("MAX_IMPORT_BYTES", "536870912",
            "Largest CSV upload accepted, on the import form only (512 MiB; above it a 413 "
            "naming the limit, and nothing is read into the database, checked first or "
            "not). A reverse proxy in front needs a body limit at least this large."),
    Setting("WEB_CONNECTION_LIMIT", "1000",
            "Open connections the web server keeps at most (waitress); more wait in the "
            "listen backlog until one closes."),
    Setting("WEB_HEAD_TIMEOUT", "10",
            "Seconds a client has to send a request's line and headers (counted from its "
            "first byte, or from the end of the previous answer on a kept-alive connection); "
            "a slower one is closed, so connections trickling bytes (slowloris) cannot hold "
            "the server's connection slots. See docs/deployment.md."),
    Setting("LOG_LEVEL", "INFO", "Python log level."),
    Setting("NODE", None,
            "This host's name for worker liveness (default: the hostname). A restarted "
            "process takes back at once the jobs its node's dead processes left behind."),
    Setting("SECURE_COOKIES", "auto",
            "auto: Secure cookies when BASE_URL is https; on/off to force."),
    Setting("DB_WEB_POOL", "5",
            "Most PostgreSQL connections the web side (UI + API) of one serve/web process "
            "opens, and the number of its request threads unless --threads says otherwise "
            "(one connection per thread: no request waits for another's connection); "
            "requests beyond it wait up to DB_STATEMENT_TIMEOUT, then get a 503. "
            "Budget per process: serve = DB_WEB_POOL + DB_DELIVERY_POOL + 2, web = "
            "DB_WEB_POOL + 1, worker = DB_DELIVERY_POOL + 1 (docs/scale-out.md)."),
    Setting("DB_DELIVERY_POOL", "4",
            "Most PostgreSQL connections the delivery threads of one serve/worker process "
            "share: claims, the finisher's session that commits outcomes, the send guard's "
            "session (a campaign message's check against a pause or cancel), maintenance "
            "(SMTP runs without one); at least 2. The liveness session (which also LISTENs) "
            "and /healthz's check come on top, one each."),
    Setting("DB_STATEMENT_TIMEOUT", "5",
            "Seconds a web request's SQL statement may run before it is cancelled and the "
            "request answered 503 \"the database is busy\" (0 = no limit)."),
    Setting("DB_LOCK_TIMEOUT", "3",
            "Seconds a web request waits for a table or row lock before it gives up with a "
            "503 \"the database is busy\" (0 = no limit)."),
    Setting("DB_IDLE_TIMEOUT", "60",
            "Seconds a pooled PostgreSQL connection may sit idle before it is closed and "
            "its slot handed back to the server (0 = keep them)."),
    Setting("PROXY_FIX", "0",
            "1 behind a reverse proxy that terminates TLS: trust one hop of X-Forwarded-For, "
            "-Proto, -Host and -Port (never enable without such a proxy: clients could "
            "forge their address)."),
    # --- after acceptance: bounces, complaints, event webhooks (docs/design.md §18) ---
    Setting("BOUNCE_ADDRESS", None,
            "Envelope sender (Return-Path) with the job encoded, VERP-style: "
            "bounces@example.com sends as bounces+<signed job token>@example.com, so a "
            "bounce finds its job. Unset: the From address is the envelope sender."),
    Setting("BOUNCE_MAILBOX", None,
            "Mailbox the workers poll for DSNs and ARF complaints: "
            "imaps://user:pass@host[:port]/INBOX, imap://… (loopback/trusted networks) or "
            "pop3s://user:pass@host[:port]. Processed mail is moved to the Processed folder "
            "(IMAP) or deleted after it was recorded (POP3)."),
    Setting("BOUNCE_MAILBOX_INTERVAL", "60", "Seconds between polls of the bounce mailbox."),
    Setting("BOUNCE_MAILBOX_CA_FILE", None,
            "PEM file of the CA to trust for the bounce mailbox's TLS (a private server)."),
    Setting("BOUNCE_MAILBOX_PROCESSED", "Processed",
            "IMAP folder processed reports are moved to (created if missing)."),
    Setting("BOUNCE_MAILBOX_UNREADABLE", "Could not read",
            "IMAP folder mail the bounce reader could not understand is moved to (created if "
            "missing; listed on Queue health with the reason)."),
    # --- receiver reports: DMARC and SMTP TLS (docs/deliverability.md) ---
    Setting("REPORT_MAILBOX", None,
            "Mailbox the workers poll for DMARC aggregate/failure and SMTP TLS reports (the "
            "address your rua=/ruf= and TLSRPT records name): imaps://user:pass@host/INBOX, "
            "imap://… or pop3s://…, as SENDDOCK_BOUNCE_MAILBOX."),
    Setting("REPORT_MAILBOX_INTERVAL", "300", "Seconds between polls of the report mailbox."),
    Setting("REPORT_MAILBOX_CA_FILE", None,
            "PEM file of the CA to trust for the report mailbox's TLS (a private server)."),
    Setting("REPORT_MAILBOX_PROCESSED", "Processed",
            "IMAP folder read reports are moved to (created if missing)."),
    Setting("REPORT_MAILBOX_UNREADABLE", "Could not read",
            "IMAP folder mail that holds no readable report is moved to (listed with the "
            "reason on the Reports page)."),
    Setting("SENDING_IPS", None,
            "Addresses and networks (comma-separated, 192.0.2.10, 2001:db8::/48) your mail "
            "leaves from: receiver reports about other sources are shown as not your relays, "
            "and the DMARC alarm watches these."),
    Setting("DMARC_PASS_ALARM", "0.98",
            "Queue health alarms when the DMARC pass rate receivers report for your own "
            "sending IPs (last 7 days) falls below this fraction."),
    Setting("SES_TOPIC_ARNS", None,
            "SNS topic ARNs (comma-separated) whose notifications /webhooks/ses accepts. "
            "Unset: SES webhooks are refused."),
    Setting("SENDGRID_WEBHOOK_KEY", None,
            "SendGrid Signed Event Webhook verification key (base64, as SendGrid shows it). "
            "Unset: /webhooks/sendgrid is refused."),
    Setting("POSTMARK_WEBHOOK_AUTH", None,
            "user:password that Postmark's webhook URL carries (basic auth). Unset: "
            "/webhooks/postmark is refused."),
    Setting("MAILGUN_SIGNING_KEY", None,
            "Mailgun HTTP webhook signing key. Unset: /webhooks/mailgun is refused."),
    Setting("WEBHOOK_MAX_AGE", "3600",
            "Seconds a signed provider webhook (SNS, SendGrid, Mailgun) stays acceptable."),
    Setting("SOFT_BOUNCE_LIMIT", "3",
            "Soft bounces of one address (within SOFT_BOUNCE_WINDOW) that suppress it."),
    Setting("SOFT_BOUNCE_WINDOW", "2592000", "Seconds soft bounces are counted over (30 days)."),
    Setting("COMPLAINT_ALARM_RATE", "0.001",
            "Complaint rate of a campaign that raises an alarm (0.001 = 0.1 %)."),
    Setting("COMPLAINT_PAUSE_RATE", "0.003",
            "Complaint rate at which a campaign is paused (0.003 = 0.3 %, Gmail's limit)."),
    Setting("COMPLAINT_MIN_DELIVERED", "100",
            "Messages a campaign must have delivered before its complaint rate can pause it."),
    Setting("EVENT_WEBHOOK_RETRY_SCHEDULE",
            "10,30,120,600,1800,3600,7200,14400,28800,43200,86400,86400",
            "Seconds between attempts to deliver an outgoing event webhook (about 3 days in "
            "all); after the last the delivery is marked failed (retry it from the "
            "endpoint's page)."),
    Setting("EVENT_WEBHOOK_DISABLE_AFTER_SECONDS", "259200",
            "Seconds an endpoint may answer no 2xx at all before it is disabled (alarm; 3 "
            "days, as Stripe; 0 = never); its waiting deliveries are kept and go out when an "
            "admin enables it again. Admins are warned after EVENT_WEBHOOK_WARN_AFTER."),
    Setting("EVENT_WEBHOOK_WARN_AFTER", "900",
            "Seconds an endpoint may answer no 2xx before admins see a warning (0 = never)."),
    Setting("EVENT_WEBHOOK_TIMEOUT", "10", "Seconds an event webhook POST may take, the "
            "whole exchange (connecting, sending, the answer's headers and body)."),
    Setting("OUTGOING_ALLOW", None,
            "Internal addresses or networks (comma-separated: 10.0.0.5, 192.168.0.0/16, ::1) "
            "that outgoing requests (event webhooks, SNS certificates) may call anyway; "
            "unset: only public addresses are called (see docs/security.md, SSRF)."),
    Setting("DNS_RESOLVER", None,
            "DNS server(s) for the sending-domain checks, host[:port][,host[:port]] (IPv6 "
            "as [::1]:53). Unset: the system resolver (/etc/resolv.conf)."),
    Setting("SPF_INCLUDE", None,
            "The SPF include your relay provider documents (amazonses.com, "
            "spf.protection.outlook.com, _spf.google.com...). Set: the SPF check asks for it; "
            "unset: the SPF check evaluates the relay host's address."),
    # SMTP submission (docs/smtp.md): read by webapp.submission.SubmissionSettings.
    Setting("SUBMISSION_LISTEN", None,
            "host:port of the SMTP submission port with STARTTLS (e.g. 0.0.0.0:587); set, "
            "senddock serve listens there too (senddock smtp always does). Unset: none."),
    Setting("SUBMISSION_TLS_LISTEN", None,
            "host:port of the SMTP submission port with implicit TLS (e.g. 0.0.0.0:465)."),
    Setting("SUBMISSION_CERT", None, "PEM certificate (chain) of the submission ports."),
    Setting("SUBMISSION_KEY", None, "PEM private key of SUBMISSION_CERT."),
    Setting("SUBMISSION_PLAIN_AUTH", "off",
            "on: AUTH without TLS on SUBMISSION_LISTEN, allowed only when it is a loopback "
            "address (a local Postfix or a container sidecar)."),
    Setting("SUBMISSION_MAX_SIZE", "26214400",
            "Largest message accepted by SMTP, in bytes (advertised as SIZE; larger: 552)."),
    Setting("SUBMISSION_MAX_RECIPIENTS", "100",
            "Recipients per submitted message (more: 452, the client sends the rest again)."),
    Setting("SUBMISSION_RATE_LIMIT", "0",
            "Messages per minute per API token and submission process (more: 450 4.7.1; "
            "0 = no limit)."),
    Setting("SUBMISSION_HOSTNAME", None,
            "Name the submission server greets with; unset: the host of SENDDOCK_BASE_URL."),
    Setting("SUBMISSION_TIMEOUT", "60",
            "Seconds a submission client may stay silent before it is disconnected."),
    Setting("SUBMISSION_MAX_CONNECTIONS", "200",
            "Open submission connections per process, both ports together (more: 421 4.7.0 "
            "and the connection is closed)."),
]


def _env(name: str) -> str | None:
    value = os.environ.get(f"SENDDOCK_{name}")
    if value is not None and value.strip() == "":
        return None
    return value


def _int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"SENDDOCK_{name} must be a whole number, got {raw!r}") from None


def _float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"SENDDOCK_{name} must be a number, got {raw!r}") from None


def _at_least(name: str, value: Any, low: float) -> Any:
    if value < low:
        raise ConfigError(f"SENDDOCK_{name} must be at least {low:g}, got {value}")
    return value


def _schedule(name: str, raw: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise ConfigError(
            f"SENDDOCK_{name} must be seconds separated by commas, got {raw!r}") from None
    if any(v < 0 for v in values):
        raise ConfigError(f"SENDDOCK_{name} cannot contain negative delays")
    return values


def _nonnegative(name: str, value: float) -> Any:
    if value < 0:
        raise ConfigError(f"SENDDOCK_{name} cannot be negative")
    return value


def _smtp_url(raw: str) -> str:
    """The URL as given, once it parses: a bad one is one line naming the variable."""
    try:
        parse_relays(raw)
    except ValueError as exc:
        message = str(exc)
        if message.startswith("SMTP URL:"):
            message = message.removeprefix("SMTP URL:").strip()
            raise ConfigError(f"SENDDOCK_SMTP_URL: {message}") from None
        raise ConfigError("SENDDOCK_SMTP_URL " + message.removeprefix("SMTP URL ")
                          if message.startswith("SMTP URL ")
                          else f"SENDDOCK_SMTP_URL: {message}") from None
    return raw


def _helo(raw: str | None) -> str | None:
    if raw is None:
        return None
    name = raw.strip()
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]", name):
        raise ConfigError(f"SENDDOCK_SMTP_HELO must be a host name or an address literal "
                          f"such as [192.0.2.1], got {raw!r}")
    if name.lower() == "localhost" or name.lower().startswith("localhost."):
        raise ConfigError("SENDDOCK_SMTP_HELO cannot be localhost: relays reject it")
    return name


def _ca_file(raw: str | None) -> str | None:
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if not path.is_file():
        raise ConfigError(f"SENDDOCK_SMTP_CA_FILE: no such file: {raw}")
    import ssl

    try:
        ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"SENDDOCK_SMTP_CA_FILE: not a PEM file of CA certificates "
                          f"({exc})") from None
    return str(path)


@dataclass(frozen=True)
class FeedbackConfig:
    """Bounces, complaints and event webhooks after acceptance (docs/design.md §18)."""

    bounce_address: str | None = None
    bounce_mailbox: str | None = None
    bounce_mailbox_interval: float = 60
    bounce_mailbox_ca_file: str | None = None
    bounce_mailbox_processed: str = "Processed"
    bounce_mailbox_unreadable: str = "Could not read"
    ses_topic_arns: frozenset[str] = frozenset()
    sendgrid_webhook_key: str | None = None
    postmark_webhook_auth: str | None = None
    mailgun_signing_key: str | None = None
    webhook_max_age: float = 3600
    soft_bounce_limit: int = 3
    soft_bounce_window: float = 2592000
    complaint_alarm_rate: float = 0.001
    complaint_pause_rate: float = 0.003
    complaint_min_delivered: int = 100
    event_webhook_retry_schedule: tuple[int, ...] = (10, 30, 120, 600, 1800, 3600, 7200,
                                                     14400, 28800, 43200, 86400, 86400)
    event_webhook_disable_after: float = 259200
    event_webhook_warn_after: float = 900
    event_webhook_timeout: float = 10
    outgoing_allow: str = ""

    def guard(self, timeout: float | None = None) -> Guard:
        """The SSRF guard every outgoing request goes through."""
        return Guard.parse_allow(self.outgoing_allow, timeout or self.event_webhook_timeout)


def _feedback(get: Any) -> FeedbackConfig:
    bounce_address = get("BOUNCE_ADDRESS")
    if bounce_address is not None and (bounce_address.count("@") != 1
                                       or "+" in bounce_address.split("@")[0]):
        raise ConfigError("SENDDOCK_BOUNCE_ADDRESS must be one address without a '+' "
                          f"(bounces@example.com), got {bounce_address!r}")
    mailbox = get("BOUNCE_MAILBOX")
    if mailbox is not None and mailbox.split("://", 1)[0] not in ("imaps", "imap", "pop3s"):
        raise ConfigError("SENDDOCK_BOUNCE_MAILBOX must start with imaps://, imap:// or "
                          "pop3s://")
    allow = get("OUTGOING_ALLOW") or ""
    try:
        Guard.parse_allow(allow)
    except ValueError as exc:
        raise ConfigError(f"SENDDOCK_OUTGOING_ALLOW: {exc}") from None
    key = get("POSTMARK_WEBHOOK_AUTH")
    if key is not None and ":" not in key:
        raise ConfigError("SENDDOCK_POSTMARK_WEBHOOK_AUTH must be user:password")
    return FeedbackConfig(
        bounce_address=bounce_address.strip() if bounce_address else None,
        bounce_mailbox=mailbox,
        bounce_mailbox_interval=max(1.0, _float("BOUNCE_MAILBOX_INTERVAL",
                                                get("BOUNCE_MAILBOX_INTERVAL"))),
        bounce_mailbox_ca_file=get("BOUNCE_MAILBOX_CA_FILE"),
        bounce_mailbox_processed=get("BOUNCE_MAILBOX_PROCESSED"),
        bounce_mailbox_unreadable=get("BOUNCE_MAILBOX_UNREADABLE"),
        ses_topic_arns=frozenset(a.strip() for a in (get("SES_TOPIC_ARNS") or "").split(",")
                                 if a.strip()),
        sendgrid_webhook_key=get("SENDGRID_WEBHOOK_KEY"),
        postmark_webhook_auth=key,
        mailgun_signing_key=get("MAILGUN_SIGNING_KEY"),
        webhook_max_age=_float("WEBHOOK_MAX_AGE", get("WEBHOOK_MAX_AGE")),
        soft_bounce_limit=max(1, _int("SOFT_BOUNCE_LIMIT", get("SOFT_BOUNCE_LIMIT"))),
        soft_bounce_window=_float("SOFT_BOUNCE_WINDOW", get("SOFT_BOUNCE_WINDOW")),
        complaint_alarm_rate=_float("COMPLAINT_ALARM_RATE", get("COMPLAINT_ALARM_RATE")),
        complaint_pause_rate=_float("COMPLAINT_PAUSE_RATE", get("COMPLAINT_PAUSE_RATE")),
        complaint_min_delivered=_int("COMPLAINT_MIN_DELIVERED", get("COMPLAINT_MIN_DELIVERED")),
        event_webhook_retry_schedule=_schedule("EVENT_WEBHOOK_RETRY_SCHEDULE",
                                               get("EVENT_WEBHOOK_RETRY_SCHEDULE")),
        event_webhook_disable_after=max(0.0, _float(
            "EVENT_WEBHOOK_DISABLE_AFTER_SECONDS", get("EVENT_WEBHOOK_DISABLE_AFTER_SECONDS"))),
        event_webhook_warn_after=max(0.0, _float("EVENT_WEBHOOK_WARN_AFTER",
                                                 get("EVENT_WEBHOOK_WARN_AFTER"))),
        event_webhook_timeout=_float("EVENT_WEBHOOK_TIMEOUT", get("EVENT_WEBHOOK_TIMEOUT")),
        outgoing_allow=allow,
    )


@dataclass
class ReportConfig:
    """Receiver reports: the report mailbox, our sending IPs, the DMARC alarm."""

    mailbox: str | None = None
    interval: float = 300
    ca_file: str | None = None
    processed: str = "Processed"
    unreadable: str = "Could not read"
    sending_ips: tuple[str, ...] = ()
    dmarc_pass_alarm: float = 0.98


def _reports(get: Any) -> ReportConfig:
    import ipaddress

    mailbox = get("REPORT_MAILBOX")
    if mailbox is not None and mailbox.split("://", 1)[0] not in ("imaps", "imap", "pop3s"):
        raise ConfigError("SENDDOCK_REPORT_MAILBOX must start with imaps://, imap:// or "
                          "pop3s://")
    networks = []
    for item in (get("SENDING_IPS") or "").split(","):
        if item.strip():
            try:
                networks.append(str(ipaddress.ip_network(item.strip(), strict=False)))
            except ValueError:
                raise ConfigError(f"SENDDOCK_SENDING_IPS: {item.strip()!r} is not an IP "
                                  "address or network") from None
    alarm = _float("DMARC_PASS_ALARM", get("DMARC_PASS_ALARM"))
    if not 0 <= alarm <= 1:
        raise ConfigError("SENDDOCK_DMARC_PASS_ALARM must be a fraction from 0 to 1 (0.98)")
    return ReportConfig(
        mailbox=mailbox,
        interval=max(1.0, _float("REPORT_MAILBOX_INTERVAL", get("REPORT_MAILBOX_INTERVAL"))),
        ca_file=get("REPORT_MAILBOX_CA_FILE"),
        processed=get("REPORT_MAILBOX_PROCESSED"),
        unreadable=get("REPORT_MAILBOX_UNREADABLE"),
        sending_ips=tuple(networks),
        dmarc_pass_alarm=alarm,
    )


@dataclass
class Config:
    """Resolved settings. Build with :func:`load`; tests pass overrides."""

    database_url: str | None
    data_dir: Path
    smtp_url: str
    mail_from: str
    base_url: str
    secret_key: str
    workers: int
    claim_batch: int
    retry_schedule: dict[str, tuple[int, ...]]
    retry_jitter: float
    resend_cooldown: int
    rate_limit: float
    rate_limit_hour: int
    rate_limit_day: int
    heartbeat_interval: float
    worker_timeout: float
    lease_grace: float
    lease_margin: float
    smtp_timeout: float
    smtp_helo: str | None
    smtp_ca_file: str | None
    smtp_max_messages: int
    smtp_max_age: float
    throttle_backoff: tuple[int, ...]
    login_probe_interval: float
    relay_probe_max: float
    same_refusal_streak: int
    max_backlog: int
    retention_campaign_days: float
    retention_transactional_days: float
    disposable_policy: str
    alarm_oldest_pending: int
    alarm_failure_rate: float
    max_request_bytes: int
    max_import_bytes: int
    log_level: str
    secure_cookies: bool
    proxy_fix: bool = False
    node: str | None = None
    db_web_pool: int = 5
    db_delivery_pool: int = 4
    db_statement_timeout: float = 5.0
    db_lock_timeout: float = 3.0
    db_idle_timeout: float = 60.0
    dns_resolver: str | None = None
    spf_include: str | None = None
    secret_key_generated: bool = False
    web_connection_limit: int = 1000
    web_head_timeout: float = 10.0
    step_up_minutes: int = 15
    oidc_issuer: str | None = None
    oidc_client_id: str = ""
    oidc_client_secret: str = ""
    oidc_role_claim: str = "groups"
    oidc_role_map: tuple[tuple[str, str], ...] = ()
    oidc_create_users: bool = False
    sso_only_domains: frozenset[str] = frozenset()
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)
    reports: ReportConfig = field(default_factory=lambda: ReportConfig())
    extra: dict[str, Any] = field(default_factory=dict)


def load(overrides: dict[str, str] | None = None, *, require_secret: bool = False) -> Config:
    """Read the environment (plus ``overrides``, keyed without the prefix) into a Config.

    Raises :class:`ConfigError` naming the variable for any unusable value.
    """
    overrides = overrides or {}

    def get(name: str) -> str | None:
        if name in overrides:
            return overrides[name]
        value = _env(name)
        if value is not None:
            return value
        return next(s.default for s in SETTINGS if s.name == name)

    def req(name: str) -> str:
        value = get(name)
        assert value is not None, name
        return value

    secret = get("SECRET_KEY")
    generated = False
    if not secret:
        if require_secret:
            raise ConfigError("SENDDOCK_SECRET_KEY is not set: set it to a long random string "
                              "(python -c 'import secrets; print(secrets.token_urlsafe(48))')")
        secret, generated = secrets.token_urlsafe(48), True
    policy = req("DISPOSABLE_POLICY")
    if policy not in {"send", "hold"}:
        raise ConfigError(f"SENDDOCK_DISPOSABLE_POLICY must be 'send' or 'hold', got {policy!r}")
    base_url = req("BASE_URL").rstrip("/")
    cookie_mode = req("SECURE_COOKIES").lower()
    secure = base_url.startswith("https://") if cookie_mode == "auto" else cookie_mode in {
        "1", "on", "true", "yes"}
    heartbeat = _float("HEARTBEAT_INTERVAL", req("HEARTBEAT_INTERVAL"))
    lease = _float("WORKER_TIMEOUT", req("WORKER_TIMEOUT"))
    if heartbeat <= 0 or lease <= heartbeat:
        raise ConfigError("SENDDOCK_WORKER_TIMEOUT (the lease) must be longer than "
                          "SENDDOCK_HEARTBEAT_INTERVAL, which must be positive")
    workers = _int("WORKERS", req("WORKERS"))
    if workers < 0:
        raise ConfigError("SENDDOCK_WORKERS cannot be negative")
    return Config(
        database_url=get("DATABASE_URL"),
        data_dir=Path(req("DATA_DIR")).expanduser().resolve(),
        smtp_url=_smtp_url(req("SMTP_URL")),
        mail_from=req("FROM"),
        base_url=base_url,
        secret_key=secret,
        secret_key_generated=generated,
        workers=workers,
        claim_batch=max(1, _int("CLAIM_BATCH", req("CLAIM_BATCH"))),
        retry_schedule={
            "broadcast": _schedule("RETRY_SCHEDULE_BROADCAST", req("RETRY_SCHEDULE_BROADCAST")),
            "verification": _schedule("RETRY_SCHEDULE_VERIFY", req("RETRY_SCHEDULE_VERIFY")),
            "test": (),
        },
        retry_jitter=_float("RETRY_JITTER", req("RETRY_JITTER")),
        resend_cooldown=_int("RESEND_COOLDOWN", req("RESEND_COOLDOWN")),
        rate_limit=_nonnegative("RATE_LIMIT", _float("RATE_LIMIT", req("RATE_LIMIT"))),
        rate_limit_hour=_nonnegative("RATE_LIMIT_HOUR",
                                     _int("RATE_LIMIT_HOUR", req("RATE_LIMIT_HOUR"))),
        rate_limit_day=_nonnegative("RATE_LIMIT_DAY",
                                    _int("RATE_LIMIT_DAY", req("RATE_LIMIT_DAY"))),
        heartbeat_interval=heartbeat,
        worker_timeout=lease,
        lease_grace=_nonnegative("LEASE_GRACE", _float("LEASE_GRACE", req("LEASE_GRACE"))),
        lease_margin=min(_nonnegative("LEASE_MARGIN",
                                      _float("LEASE_MARGIN", req("LEASE_MARGIN"))),
                         max(0.0, (lease - heartbeat) / 2)),
        smtp_timeout=_float("SMTP_TIMEOUT", req("SMTP_TIMEOUT")),
        smtp_helo=_helo(get("SMTP_HELO")),
        smtp_ca_file=_ca_file(get("SMTP_CA_FILE")),
        smtp_max_messages=max(1, _int("SMTP_MAX_MESSAGES", req("SMTP_MAX_MESSAGES"))),
        smtp_max_age=_float("SMTP_MAX_AGE", req("SMTP_MAX_AGE")),
        throttle_backoff=_schedule("THROTTLE_BACKOFF", req("THROTTLE_BACKOFF")) or (30,),
        login_probe_interval=_float("LOGIN_PROBE_INTERVAL", req("LOGIN_PROBE_INTERVAL")),
        relay_probe_max=max(1.0, _float("RELAY_PROBE_MAX", req("RELAY_PROBE_MAX"))),
        same_refusal_streak=_int("SAME_REFUSAL_STREAK", req("SAME_REFUSAL_STREAK")),
        max_backlog=_int("MAX_BACKLOG", req("MAX_BACKLOG")),
        retention_campaign_days=_nonnegative(
            "RETENTION_CAMPAIGN_DAYS",
            _float("RETENTION_CAMPAIGN_DAYS", req("RETENTION_CAMPAIGN_DAYS"))),
        retention_transactional_days=_nonnegative(
            "RETENTION_TRANSACTIONAL_DAYS",
            _float("RETENTION_TRANSACTIONAL_DAYS", req("RETENTION_TRANSACTIONAL_DAYS"))),
        disposable_policy=policy,
        alarm_oldest_pending=_int("ALARM_OLDEST_PENDING", req("ALARM_OLDEST_PENDING")),
        alarm_failure_rate=_float("ALARM_FAILURE_RATE", req("ALARM_FAILURE_RATE")),
        max_request_bytes=_int("MAX_REQUEST_BYTES", req("MAX_REQUEST_BYTES")),
        max_import_bytes=_int("MAX_IMPORT_BYTES", req("MAX_IMPORT_BYTES")),
        log_level=req("LOG_LEVEL").upper(),
        secure_cookies=secure,
        proxy_fix=req("PROXY_FIX").lower() in {"1", "on", "true", "yes"},
        node=get("NODE"),
        db_web_pool=_at_least("DB_WEB_POOL", _int("DB_WEB_POOL", req("DB_WEB_POOL")), 1),
        db_delivery_pool=_at_least("DB_DELIVERY_POOL",
                                   _int("DB_DELIVERY_POOL", req("DB_DELIVERY_POOL")), 2),
        db_statement_timeout=_at_least(
            "DB_STATEMENT_TIMEOUT",
            _float("DB_STATEMENT_TIMEOUT", req("DB_STATEMENT_TIMEOUT")), 0),
        db_lock_timeout=_at_least("DB_LOCK_TIMEOUT",
                                  _float("DB_LOCK_TIMEOUT", req("DB_LOCK_TIMEOUT")), 0),
        db_idle_timeout=_at_least("DB_IDLE_TIMEOUT",
                                  _float("DB_IDLE_TIMEOUT", req("DB_IDLE_TIMEOUT")), 0),
        web_connection_limit=_at_least(
            "WEB_CONNECTION_LIMIT", _int("WEB_CONNECTION_LIMIT", req("WEB_CONNECTION_LIMIT")), 1),
        web_head_timeout=_at_least(
            "WEB_HEAD_TIMEOUT", _float("WEB_HEAD_TIMEOUT", req("WEB_HEAD_TIMEOUT")), 1),
        feedback=_feedback(get),
        reports=_reports(get),
        step_up_minutes=_at_least("STEP_UP_MINUTES",
                                  _int("STEP_UP_MINUTES", req("STEP_UP_MINUTES")), 1),
        **_oidc(get, req),
        dns_resolver=get("DNS_RESOLVER"),
        spf_include=get("SPF_INCLUDE"),
    )


def _oidc(get: Any, req: Any) -> dict[str, Any]:
    """The single sign-on settings (``SENDDOCK_OIDC_*``, ``SENDDOCK_SSO_ONLY_DOMAINS``)."""
    issuer = (get("OIDC_ISSUER") or "").strip().rstrip("/") or None
    pairs = []
    for item in (req("OIDC_ROLE_MAP") or "").split(","):
        if not item.strip():
            continue
        value, sep, role = item.partition("=")
        if not sep or role.strip() not in ("admin", "marketer", "support") or not value.strip():
            raise ConfigError(f"SENDDOCK_OIDC_ROLE_MAP: {item.strip()!r} is not "
                              "value=admin|marketer|support")
        pairs.append((value.strip(), role.strip()))
    if issuer and not (get("OIDC_CLIENT_ID") and get("OIDC_CLIENT_SECRET")):
        raise ConfigError("SENDDOCK_OIDC_ISSUER is set: SENDDOCK_OIDC_CLIENT_ID and "
                          "SENDDOCK_OIDC_CLIENT_SECRET are needed too")
    create = req("OIDC_CREATE_USERS").strip().lower()
    if create not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
        raise ConfigError("SENDDOCK_OIDC_CREATE_USERS must be on or off")
    return {
        "oidc_issuer": issuer, "oidc_client_id": get("OIDC_CLIENT_ID") or "",
        "oidc_client_secret": get("OIDC_CLIENT_SECRET") or "",
        "oidc_role_claim": req("OIDC_ROLE_CLAIM").strip() or "groups",
        "oidc_role_map": tuple(pairs),
        "oidc_create_users": create in ("on", "true", "1", "yes"),
        "sso_only_domains": frozenset(d.strip().lower().lstrip("@") for d in
                                      (req("SSO_ONLY_DOMAINS") or "").split(",") if d.strip()),
    }


DOC_BEGIN = "<!-- settings:begin"
DOC_END = "<!-- settings:end -->"


def with_table(document: str) -> str:
    """``document`` (docs/configuration.md) with its generated settings block replaced by
    the current :func:`markdown_table`."""
    start = document.index(DOC_BEGIN)
    start = document.index("\n", start) + 1
    end = document.index(DOC_END, start)
    return document[:start] + markdown_table() + "\n" + document[end:]


def markdown_table() -> str:
    """The settings as the Markdown table in docs/configuration.md."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default is not None else "(unset)"
        rows.append(f"| `SENDDOCK_{s.name}` | {default} | {s.help} |")
    return "\n".join(rows)
