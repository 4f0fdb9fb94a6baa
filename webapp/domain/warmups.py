"""Warm-up schedules as people change them, on the pages and through the API
(docs/design.md §33): checked, started or stopped, and audited. The pacer enforces them
(:mod:`workers.delivery.warmup`); this module only decides what is stored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.errors import Invalid, NotFound
from workers.building import dkim
from workers.core.i18n import N_, message_of
from workers.delivery import warmup

MAX_CAP = 999_999_999


def domain_name(domain: str) -> str:
    """The domain in a URL, normalized; a name that is no domain is not found."""
    try:
        return dkim.normalize_domain(domain)
    except dkim.DkimError as exc:
        raise NotFound(message_of(exc)) from None


def check_caps(value: Any) -> list[int] | None:
    """Daily caps as the API gives them: null (the built-in ramp) or 1 to
    :data:`workers.delivery.warmup.MAX_DAYS` whole numbers above 0."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > warmup.MAX_DAYS:
        raise Invalid(N_("caps is a list of 1 to %(n)s daily caps, or null for the built-in "
                         "ramp", n=warmup.MAX_DAYS), fields={"caps": N_("invalid")})
    if not all(type(cap) is int and 0 < cap <= MAX_CAP for cap in value):
        raise Invalid(N_("Daily caps are whole numbers from 1 to %(max)s.", max=MAX_CAP),
                      fields={"caps": N_("invalid")})
    return list(value)


def check_hour_share(value: Any) -> float:
    """The hourly cap as a whole percentage of the day's (1-100; absent: 25)."""
    if value is None:
        return warmup.DEFAULT_HOUR_SHARE
    if type(value) is not int or not 1 <= value <= 100:
        raise Invalid(N_("The hourly share is a whole percentage from 1 to 100."),
                      fields={"hour_share_percent": N_("invalid")})
    return value / 100


def as_json(today: warmup.Today) -> dict[str, Any]:
    return {"domain": today.domain, "started_on": today.started_on.isoformat(),
            "day": today.day, "daily_cap": today.daily_cap, "hourly_cap": today.hourly_cap,
            "sent_today": today.sent_today, "sent_this_hour": today.sent_hour,
            "allowed_now": today.allowed, "custom_schedule": today.custom,
            "finished": today.daily_cap is None}


def start(conn: Connection, domain: str, caps: Sequence[int] | None, hour_share: float,
          actor: str) -> warmup.Today:
    """Start the domain's warm-up today (a running one restarts from day 1)."""
    warmup.start(conn, domain, caps, hour_share)
    audit.record(conn, actor, "warmup.start", f"domain:{domain}",
                 caps=list(caps) if caps else None, hour_share=hour_share)
    today = warmup.status(conn, domain)
    assert today is not None  # just written in this transaction
    return today


def stop(conn: Connection, domain: str, actor: str) -> bool:
    """End the domain's warm-up (False: it had none)."""
    stopped = warmup.stop(conn, domain)
    if stopped:
        audit.record(conn, actor, "warmup.stop", f"domain:{domain}")
    return stopped


def get(conn: Connection, domain: str) -> warmup.Today:
    today = warmup.status(conn, domain)
    if today is None:
        raise NotFound(N_("%(domain)s is not in warm-up", domain=domain))
    return today
