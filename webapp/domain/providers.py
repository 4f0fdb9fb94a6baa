"""How each big receiving provider treats our mail, from SendDock's own attempts
(docs/deliverability.md): per day and provider group, accepted, deferred, bounced and
complained, with the complaint rate beside Gmail's and Yahoo's bulk-sender thresholds.

The group comes from the recipient's domain (gmail.com, outlook.com, yahoo.co.uk, …) and,
for any other domain, from its MX hosts when DNS answers (a company on Google Workspace or
Microsoft 365 is counted with Gmail or Microsoft). Answers are kept for an hour per
process; at most ``MX_LOOKUPS`` domains are asked per page view (the biggest first)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import dns.exception
import dns.resolver
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain.domain_checks import make_resolver
from workers.core.settings import Config
from workers.delivery.classify import ReplyClass

GROUPS = ("gmail", "microsoft", "yahoo", "apple", "other")
GROUP_NAMES = {"gmail": "Gmail / Google Workspace", "microsoft": "Microsoft",
               "yahoo": "Yahoo / AOL", "apple": "Apple", "other": "Others"}
#: Bulk-sender complaint-rate limits: Gmail asks to stay below 0.1 % (never reach 0.3 %),
#: Yahoo below 0.3 %.
THRESHOLDS = {"gmail": 0.001, "yahoo": 0.003}
MX_LOOKUPS = 100
MX_TTL = 3600.0

_DOMAINS = {
    "gmail": ("gmail.com", "googlemail.com"),
    "microsoft": ("outlook.com", "hotmail.com", "live.com", "msn.com", "hotmail.co.uk",
                  "hotmail.fr", "hotmail.es", "hotmail.de", "hotmail.it", "live.co.uk",
                  "live.fr", "outlook.es", "outlook.fr", "outlook.de", "windowslive.com"),
    "yahoo": ("yahoo.com", "ymail.com", "rocketmail.com", "aol.com", "aim.com",
              "yahoo.co.uk", "yahoo.fr", "yahoo.es", "yahoo.de", "yahoo.it", "yahoo.co.jp",
              "yahoo.com.br", "yahoo.com.mx", "yahoo.ca", "yahoo.in", "aol.co.uk"),
    "apple": ("icloud.com", "me.com", "mac.com"),
}
_BY_DOMAIN = {d: g for g, domains in _DOMAINS.items() for d in domains}
_MX_SUFFIXES = (
    ("gmail", ("google.com", "googlemail.com")),
    ("microsoft", ("protection.outlook.com", "outlook.com", "hotmail.com")),
    ("yahoo", ("yahoodns.net", "yahoo.com", "aol.com")),
    ("apple", ("icloud.com", "apple.com", "me.com")),
)

_mx_cache: dict[str, tuple[float, str | None]] = {}
_mx_lock = threading.Lock()

ACCEPTED = ("sent",)
BOUNCED = ("hard_bounce", "rejected")
DEFERRED = ("transient", "domain_throttle", "sender")


def group_of_domain(domain: str) -> str | None:
    """The group a recipient domain belongs to by name alone, None when only MX can say."""
    domain = domain.lower().rstrip(".")
    if domain in _BY_DOMAIN:
        return _BY_DOMAIN[domain]
    if domain.startswith(("yahoo.", "hotmail.", "outlook.", "live.")):
        return {"y": "yahoo"}.get(domain[0], "microsoft")
    return None


def group_of_mx(hosts: list[str]) -> str:
    for group, suffixes in _MX_SUFFIXES:
        for host in hosts:
            host = host.lower().rstrip(".")
            if any(host == s or host.endswith("." + s) for s in suffixes):
                return group
    return "other"


def _mx_group(resolver: dns.resolver.Resolver, domain: str) -> str | None:
    now = time.monotonic()
    with _mx_lock:
        hit = _mx_cache.get(domain)
    if hit and now - hit[0] < MX_TTL:
        return hit[1]
    try:
        answer = resolver.resolve(domain, "MX", raise_on_no_answer=False, search=False)
        hosts = [str(r.exchange) for r in answer or []]
        group: str | None = group_of_mx(hosts) if hosts else "other"
    except dns.resolver.NXDOMAIN:
        group = "other"
    except (dns.exception.DNSException, OSError):
        group = None  # DNS did not answer: by name only, asked again next time
    if group is not None:
        with _mx_lock:
            _mx_cache[domain] = (now, group)
    return group


def forget() -> None:
    with _mx_lock:
        _mx_cache.clear()


def classify(conn_domains: list[str], config: Config) -> dict[str, str]:
    """Recipient domain → group, by name, else by MX for up to MX_LOOKUPS domains."""
    result: dict[str, str] = {}
    unknown: list[str] = []
    for domain in conn_domains:
        group = group_of_domain(domain)
        if group is None:
            unknown.append(domain)
        else:
            result[domain] = group
    resolver = make_resolver(config.dns_resolver, timeout=1.0) if unknown else None
    for i, domain in enumerate(unknown):
        group = _mx_group(resolver, domain) if resolver and i < MX_LOOKUPS else None
        result[domain] = group or "other"
    return result


# Attempt outcomes (workers.delivery.classify.ReplyClass) as the providers page counts them.
_OUTCOMES = {
    "accepted": [ReplyClass.SENT.value],
    "deferred": [ReplyClass.TRANSIENT.value, ReplyClass.DOMAIN_THROTTLE.value,
                 ReplyClass.SENDER.value],
    "bounced": [ReplyClass.HARD_BOUNCE.value, ReplyClass.REJECTED.value],
}


def provider_view(conn: Connection, config: Config, days: int = 30) -> dict[str, Any]:
    since = datetime.now(UTC) - timedelta(days=days)
    rows = conn.execute(sa.text("""
        SELECT date_trunc('day', a.started_at AT TIME ZONE 'UTC')::date AS day,
               lower(split_part(j.email, '@', 2)) AS domain,
               count(*) FILTER (WHERE a.outcome = ANY(:accepted)) AS accepted,
               count(*) FILTER (WHERE a.outcome = ANY(:deferred)) AS deferred,
               count(*) FILTER (WHERE a.outcome = ANY(:bounced)) AS bounced
        FROM job_attempts a JOIN delivery_jobs j ON j.id = a.job_id
        WHERE a.started_at >= :since
        GROUP BY 1, 2"""), {"since": since, **_OUTCOMES}).all()
    events = conn.execute(sa.text("""
        SELECT date_trunc('day', e.created_at AT TIME ZONE 'UTC')::date AS day,
               lower(split_part(e.email, '@', 2)) AS domain,
               count(*) FILTER (WHERE e.type = 'complaint') AS complained,
               count(*) FILTER (WHERE e.type = 'bounce' AND e.bounce = 'hard') AS bounced
        FROM job_events e WHERE e.created_at >= :since GROUP BY 1, 2"""),
        {"since": since}).all()
    volume: dict[str, int] = {}
    for r in rows:
        volume[r.domain] = volume.get(r.domain, 0) + int(r.accepted + r.deferred + r.bounced)
    for r in events:
        volume.setdefault(r.domain, 0)
    groups = classify(sorted(volume, key=lambda d: -volume[d]), config)
    empty = {"accepted": 0, "deferred": 0, "bounced": 0, "complained": 0}
    per_day: dict[tuple[Any, str], dict[str, int]] = {}
    totals: dict[str, dict[str, int]] = {g: dict(empty) for g in GROUPS}
    for r in rows:
        key = (r.day, groups[r.domain])
        cell = per_day.setdefault(key, dict(empty))
        for name in ("accepted", "deferred", "bounced"):
            cell[name] += int(getattr(r, name))
            totals[key[1]][name] += int(getattr(r, name))
    for r in events:
        key = (r.day, groups[r.domain])
        cell = per_day.setdefault(key, dict(empty))
        cell["complained"] += int(r.complained)
        cell["bounced"] += int(r.bounced)
        totals[key[1]]["complained"] += int(r.complained)
        totals[key[1]]["bounced"] += int(r.bounced)

    def rate(cell: dict[str, int]) -> float | None:
        return cell["complained"] / cell["accepted"] if cell["accepted"] else None

    return {
        "days": days, "groups": GROUPS, "names": GROUP_NAMES, "thresholds": THRESHOLDS,
        "totals": [{"group": g, **totals[g], "complaint_rate": rate(totals[g])}
                   for g in GROUPS],
        "per_day": [{"day": day, "group": g, **cell, "complaint_rate": rate(cell)}
                    for (day, g), cell in sorted(per_day.items(),
                                                 key=lambda kv: (kv[0][0], GROUPS.index(
                                                     kv[0][1])), reverse=True)],
    }
