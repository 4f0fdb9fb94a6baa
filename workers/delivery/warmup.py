"""Warm-up that the pacer enforces (docs/design.md §33).

A sending domain in warm-up (a row in ``warmups``) may send, on its n-th day (the database's
UTC date; the start day is day 1), at most the n-th daily cap of its schedule (its own table
of caps, or the built-in ramp :data:`RAMP`), and in any clock hour at most ``hour_share`` of
that day's cap (rounded up). After the last day of the schedule the domain has no cap.

The pacer asks :func:`hold_over_cap` after each claim: within one transaction that locks
the domain's warm-up row (so every process shares the caps) and only then reads what was
counted, the claimed jobs within the caps are counted in ``warmup_sends`` and go out;
transactional mail (any kind but the campaign and sequence kinds) always goes out and is
counted, taking room from the campaign mail; the rest go back to ``pending`` unsent, with
no attempt used, due again at the start of the next hour (hourly cap reached) or of the
next day (daily cap reached). Mail beyond the cap waits; it never fails."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from workers import queue
from workers.building import kinds
from workers.core.i18n import N_
from workers.core.jobs import ClaimedJob
from workers.delivery.statements import StatementDb

#: The built-in ramp: daily caps for days 1, 2, ... of a warm-up.
RAMP = (50, 100, 200, 400, 750, 1_500, 2_500, 4_000, 6_000, 10_000, 15_000, 25_000,
        40_000, 60_000, 100_000, 150_000, 250_000)
DEFAULT_HOUR_SHARE = 0.25
#: How long a process trusts its last look at whether any domain is in warm-up: a warm-up
#: started elsewhere holds this process's claims within this many seconds.
CHECK_EVERY = 2.0
#: Per database (a process may reach several, as the tests do): when it looked, and what.
_seen: dict[str, tuple[float, bool]] = {}


@dataclass(frozen=True)
class Today:
    domain: str
    started_on: date
    day: int  # 1 on the start day
    daily_cap: int | None  # None: the schedule is over, no cap
    hourly_cap: int | None
    sent_today: int
    sent_hour: int
    custom: bool

    @property
    def allowed(self) -> int | None:
        """How many more may go out now (None: no cap)."""
        if self.daily_cap is None or self.hourly_cap is None:
            return None
        return max(0, min(self.daily_cap - self.sent_today, self.hourly_cap - self.sent_hour))


def caps_for(day: int, caps: Sequence[int] | None,
             hour_share: float) -> tuple[int | None, int | None]:
    """(daily cap, hourly cap) on ``day`` of a warm-up (1-based); (None, None) past the
    schedule's end."""
    schedule = tuple(caps) if caps else RAMP
    if day < 1 or day > len(schedule):
        return None, None
    daily = schedule[day - 1]
    return daily, max(1, math.ceil(daily * hour_share))


# The warm-ups of these domains with today's and this hour's sends, on the database clock.
_TODAY = sa.text("""
SELECT w.domain, w.started_on, w.caps, w.hour_share,
       (now() AT TIME ZONE 'UTC')::date - w.started_on + 1 AS day,
       coalesce((SELECT sum(s.sent) FROM warmup_sends s WHERE s.domain = w.domain
                   AND s.hour >= date_trunc('day', now() AT TIME ZONE 'UTC')
                                 AT TIME ZONE 'UTC'), 0) AS sent_today,
       coalesce((SELECT s.sent FROM warmup_sends s WHERE s.domain = w.domain
                   AND s.hour = date_trunc('hour', now())), 0) AS sent_hour
  FROM warmups w WHERE w.domain = ANY(CAST(:domains AS text[]))
 ORDER BY w.domain
""")


# Every claim's count of a domain waits for the one before it (in one order: no deadlock).
# The sends are read after it, in a statement of their own: a statement that waited on the
# lock would still read with the snapshot it started with, not see what the claim before
# it counted, and both would send up to the cap.
_LOCK = sa.text("""
SELECT domain FROM warmups WHERE domain = ANY(CAST(:domains AS text[]))
 ORDER BY domain FOR UPDATE
""")


def _today(row: Any) -> Today:
    daily, hourly = caps_for(int(row.day), row.caps, float(row.hour_share))
    return Today(row.domain, row.started_on, int(row.day), daily, hourly,
                 int(row.sent_today), int(row.sent_hour), bool(row.caps))


def status(conn: Connection, domain: str) -> Today | None:
    """The domain's warm-up today (None: not in warm-up)."""
    row = conn.execute(_TODAY, {"domain": domain, "domains": [domain]}).first()
    return _today(row) if row else None


def all_today(conn: Connection) -> list[Today]:
    """Every domain in warm-up, today (Queue health)."""
    domains = conn.execute(sa.text("SELECT domain FROM warmups")).scalars().all()
    if not domains:
        return []
    return [_today(row) for row in conn.execute(_TODAY, {"domains": list(domains)})]


@dataclass(frozen=True)
class Outlook:
    """How a domain's warm-up paces ``count`` more messages: today's state, and the day of
    the warm-up (and its date) by which the schedule's caps let them all go out."""
    today: Today
    count: int
    finish_day: int
    finish_on: date

    @property
    def held(self) -> bool:
        """Some of them wait for a later day."""
        return self.finish_day > self.today.day


def outlook(conn: Connection, domain: str, count: int) -> Outlook | None:
    """When ``count`` more messages of ``domain`` can have gone out under its warm-up, at
    the schedule's daily caps and counting nothing else the domain sends (None: the domain
    is not in warm-up or its schedule is over). An estimate for the campaign page: the
    caps decide the days, not the sending rate."""
    row = conn.execute(_TODAY, {"domains": [domain]}).first()
    if row is None:
        return None
    today = _today(row)
    if today.daily_cap is None:
        return None
    left = count - max(0, today.daily_cap - today.sent_today)
    day = today.day
    while left > 0:
        day += 1
        daily, _hourly = caps_for(day, row.caps, float(row.hour_share))
        if daily is None:
            break  # past the schedule: no cap, the rest go that day
        left -= daily
    return Outlook(today, count, day, today.started_on + timedelta(days=day - 1))


def start(conn: Connection, domain: str, caps: Sequence[int] | None = None,
          hour_share: float = DEFAULT_HOUR_SHARE) -> None:
    """Start (or restart from day 1) the domain's warm-up today."""
    conn.execute(sa.text("""
        INSERT INTO warmups (domain, started_on, caps, hour_share)
        VALUES (:domain, (now() AT TIME ZONE 'UTC')::date, :caps, :share)
        ON CONFLICT (domain) DO UPDATE SET started_on = EXCLUDED.started_on,
            caps = EXCLUDED.caps, hour_share = EXCLUDED.hour_share"""),
        {"domain": domain, "caps": list(caps) if caps else None, "share": hour_share})


def stop(conn: Connection, domain: str) -> bool:
    """End the domain's warm-up: its mail is no longer capped."""
    return conn.execute(sa.text("DELETE FROM warmups WHERE domain = :domain"),
                        {"domain": domain}).rowcount > 0


def sending_domain(job: ClaimedJob) -> str:
    """The domain the job is sent as (its Message-ID's, set from the From address)."""
    return job.message_id.rstrip(">").rpartition("@")[2].lower()


_COUNT = sa.text("""
INSERT INTO warmup_sends AS s (domain, hour, sent)
VALUES (:domain, date_trunc('hour', now()), :n)
ON CONFLICT ON CONSTRAINT warmup_sends_pkey DO UPDATE SET sent = s.sent + EXCLUDED.sent
""")

def any_warmup(conn: Connection) -> bool:
    """Whether any domain is in warm-up (looked up at most every CHECK_EVERY seconds)."""
    key = _key(conn.engine)
    active = _known(key)
    if active is None:
        active = bool(conn.execute(sa.text("SELECT EXISTS (SELECT 1 FROM warmups)")).scalar_one())
        _seen[key] = (time.monotonic(), active)
    return active


def _key(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _known(key: str) -> bool | None:
    """What was last looked up for the database, if it was within CHECK_EVERY seconds."""
    at, active = _seen.get(key, (-math.inf, False))
    return active if time.monotonic() - at <= CHECK_EVERY else None


def hold_over_cap(conn: Connection, jobs: Sequence[ClaimedJob]) -> list[ClaimedJob]:
    """The claimed jobs that may go out now under their domains' warm-up caps, counted as
    sent; the others are handed back to wait (see the module's docstring). Call in one
    transaction (the warm-up rows stay locked until it commits)."""
    by_domain: dict[str, list[ClaimedJob]] = defaultdict(list)
    for job in jobs:
        by_domain[sending_domain(job)].append(job)
    domains = sorted(by_domain)
    conn.execute(_LOCK, {"domains": domains})
    rows = conn.execute(_TODAY, {"domains": domains}).all()
    held: set[int] = set()
    for row in rows:
        today = _today(row)
        allowed = today.allowed
        if allowed is None:
            continue
        mine = by_domain[today.domain]
        # Transactional mail (a password reset, a receipt) is counted but never held.
        urgent = [j for j in mine if j.kind not in kinds.RESERVED]
        bulk = [j for j in mine if j.kind in kinds.RESERVED]
        room = max(0, allowed - len(urgent))
        going, waiting = urgent + bulk[:room], bulk[room:]
        if going:
            conn.execute(_COUNT, {"domain": today.domain, "n": len(going)})
        if waiting:
            assert today.daily_cap is not None
            next_day = today.sent_today + len(going) >= today.daily_cap
            queue.hold_claimed(conn, waiting, next_day=next_day)
            held.update(j.id for j in waiting)
    return [j for j in jobs if j.id not in held]



class WarmupError(ValueError):
    """A warm-up setting that cannot be used; the message says why (translatable)."""


MAX_DAYS = 365


def parse_caps(text: str) -> list[int] | None:
    """A table of daily caps as typed ("50, 100 200"): None when blank (the built-in ramp)."""
    words = text.replace(",", " ").split()
    if not words:
        return None
    if len(words) > MAX_DAYS:
        raise WarmupError(N_("A warm-up schedule has at most %(n)s days.", n=MAX_DAYS))
    caps = []
    for w in words:
        if not (w.isascii() and w.isdigit() and len(w) <= 9 and int(w) > 0):
            raise WarmupError(N_("Daily caps are whole numbers above 0, not “%(value)s”.",
                                 value=w[:40]))
        caps.append(int(w))
    return caps


def parse_hour_share(text: str) -> float:
    """The hourly cap as a percentage of the day's (1-100; blank: 25)."""
    text = text.strip().rstrip("%").strip()
    if not text:
        return DEFAULT_HOUR_SHARE
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 100):
        raise WarmupError(N_("The hourly share is a whole percentage from 1 to 100."))
    return int(text) / 100


def within_caps(db: StatementDb, jobs: list[ClaimedJob], slots: list[float],
                timeout: float) -> tuple[list[ClaimedJob], list[float]]:
    """The claimed jobs that sending domains in warm-up may send now, with their slots; the
    rest wait, handed back unsent (docs/design.md §33)."""
    if not jobs or _known(_key(db.engine)) is False:
        return jobs, slots  # (no transaction for nothing: it cost each claim 4 round trips)
    with db.transaction(timeout) as conn:
        if not any_warmup(conn):
            return jobs, slots
        going = {j.id for j in hold_over_cap(conn, jobs)}
    kept = [(j, s) for j, s in zip(jobs, slots, strict=True) if j.id in going]
    return [j for j, _ in kept], [s for _, s in kept]
