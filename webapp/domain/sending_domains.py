"""Sending domains as the admins' page and the campaign review page see them: the domains
mail goes out From, their DKIM keys, the DNS checks, and what a campaign's review warns
about (SPEC 13; Gmail's and Yahoo's bulk-sender rules)."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from email.utils import parseaddr
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain import domain_checks as dc
from webapp.domain.errors import Invalid
from workers.building import dkim
from workers.core.i18n import N_, message_of
from workers.core.settings import Config
from workers.core.states import Campaign, sql_list
from workers.delivery.smtp import parse_relays

_UNSUBSCRIBE_VARIABLE = re.compile(r"\{\{-?\s*unsubscribe_url\b")
_CACHE_SECONDS = 60.0


@dataclass
class DomainView:
    domain: str
    keys: list[dkim.KeyRecord]
    uses: list[str]


def domain_of(address: str) -> str:
    addr = parseaddr(address)[1]
    return addr.rpartition("@")[2].lower().rstrip(".") if "@" in addr else ""


def overview(conn: Connection, config: Config) -> list[DomainView]:
    """Every domain with a key or in use (SENDDOCK_FROM, campaigns not yet finished), with
    its keys and what uses it."""
    uses: dict[str, list[str]] = {}
    default = domain_of(config.mail_from)
    if default:
        uses.setdefault(default, []).append(N_("SENDDOCK_FROM (verification and "
                                               "transactional mail)"))
    for row in conn.execute(sa.text(
            f"SELECT name, from_addr FROM campaigns WHERE status IN {sql_list(Campaign.OPEN)} "
            "ORDER BY id DESC LIMIT 500")):
        domain = domain_of(row.from_addr)
        if domain:
            uses.setdefault(domain, []).append(N_("campaign “%(name)s”", name=row.name))
    keys = dkim.list_keys(conn)
    for domain in conn.execute(sa.text("SELECT domain FROM sending_domains")).scalars():
        uses.setdefault(domain, [])
    return [DomainView(domain, [k for k in keys if k.domain == domain], uses[domain])
            for domain in sorted(uses)]


def create_key(conn: Connection, config: Config, domain: str, *, algorithm: str,
               selector: str | None, actor: str) -> dkim.KeyRecord:
    """A new key (see :func:`workers.building.dkim.create_key`), audited; bad input is Invalid."""
    try:
        key = dkim.create_key(conn, config.secret_key, domain, selector=selector or None,
                              algorithm=algorithm)
    except dkim.DkimError as exc:
        raise Invalid(message_of(exc), fields={"domain": message_of(exc)}) from None
    audit.record(conn, actor, "dkim.create", f"domain:{key.domain}", selector=key.selector,
                 algorithm=key.algorithm, status=key.status)
    forget(key.domain)
    return key


def activate_key(conn: Connection, domain: str, selector: str, *,
                 actor: str) -> dkim.KeyRecord:
    try:
        key = dkim.activate_key(conn, domain, selector)
    except dkim.DkimError as exc:
        raise Invalid(message_of(exc)) from None
    audit.record(conn, actor, "dkim.activate", f"domain:{key.domain}", selector=selector)
    forget(key.domain)
    return key


def delete_key(conn: Connection, domain: str, selector: str, *, actor: str) -> bool:
    try:
        deleted = dkim.delete_key(conn, domain, selector)
    except dkim.DkimError as exc:
        raise Invalid(message_of(exc)) from None
    if deleted:
        audit.record(conn, actor, "dkim.delete", f"domain:{domain}", selector=selector)
        forget(domain)
    return deleted


# -- DNS reports, cached briefly so the review page does not wait on DNS every time ----

_reports: dict[str, tuple[float, dc.DomainReport]] = {}
_lock = threading.Lock()


def forget(domain: str | None = None) -> None:
    """Drop cached reports (a key changed, or an admin asked to check again)."""
    with _lock:
        if domain is None:
            _reports.clear()
        else:
            _reports.pop(domain, None)


def report(conn: Connection, config: Config, domain: str, *,
           fresh: bool = False) -> dc.DomainReport:
    """The DNS checks of ``domain`` (cached for a minute unless ``fresh``)."""
    with _lock:
        cached = _reports.get(domain)
    if cached and not fresh and time.monotonic() - cached[0] < _CACHE_SECONDS:
        return cached[1]
    keys = dkim.list_keys(conn)
    try:
        resolver = dc.make_resolver(config.dns_resolver, timeout=2.0)
        relay_host = parse_relays(config.smtp_url)[0].smtp.host
    except ValueError as exc:
        return dc.DomainReport(domain, [dc.Check("settings", dc.PROBLEM, str(exc))])
    bounce = config.feedback.bounce_address
    result = dc.check_domain(resolver, domain, keys, relay_host=relay_host,
                             bounce_address=bounce or f"postmaster@{domain}",
                             spf_include=config.spf_include)
    with _lock:
        _reports[domain] = (time.monotonic(), result)
    return result


def has_visible_unsubscribe(text_body: str | None, html_body: str | None) -> bool:
    """Whether the body the reader sees shows ``{{ unsubscribe_url }}``: the HTML part when
    there is one (most readers show it), else the text."""
    shown = html_body if html_body else text_body
    return bool(shown and _UNSUBSCRIBE_VARIABLE.search(shown))


def review_checks(conn: Connection, config: Config, campaign: dict[str, Any]) -> list[dc.Check]:
    """What the review page warns about before a send: the From domain's failing DNS checks
    (free-mail From included) and a body without a visible unsubscribe link."""
    checks: list[dc.Check] = []
    if not has_visible_unsubscribe(campaign.get("text_body"), campaign.get("html_body")):
        checks.append(dc.Check("unsubscribe link", dc.PROBLEM, "the body has no visible "
                               "unsubscribe link: Gmail and Yahoo require one in marketing "
                               "mail (the List-Unsubscribe header alone is not enough).",
                               "add a link to {{ unsubscribe_url }} to the body"))
    domain = domain_of(campaign["from_addr"])
    if domain:
        checks.extend(c for c in report(conn, config, domain).checks if not c.ok)
    return checks
