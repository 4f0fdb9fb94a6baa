"""The relays' state (up, down, probed) and the pacing a throttling relay imposes
(docs/design.md §16, §17)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core.states import (
    SENT,
)

# --- relay state (P6) ------------------------------------------------------------------

# Pause all delivery (every process: the claim reads this row) and probe with backoff:
# 2, 4, ... s up to :probe_max (SENDDOCK_RELAY_PROBE_MAX); after a refused login no more
# often than :login_interval (docs/design.md §16: a fail2ban jail must never ban us). The refused
# URL's fingerprint is kept, so a process started with a different one probes at once.
# The pause escalates once per probe cycle (docs/design.md §17): a failure seen by a drain thread
# while the relay is already down (another thread's reply, or a send that started before
# the pause) changes neither the failure count nor the next probe; only a failed probe,
# or a different reason (a refused login now), does. The row lock makes this a
# compare-and-set across every thread and process.
_RELAY_DOWN = sa.text("""
UPDATE relay_state
   SET status = 'down', since = CASE WHEN status = 'down' THEN since ELSE now() END,
       last_error = :error,
       failures = CASE WHEN status = 'down' AND NOT :probe
                        AND reason IS NOT DISTINCT FROM :reason
                       THEN failures ELSE failures + 1 END,
       reason = :reason, smtp_fingerprint = :fingerprint,
       probe_recipient = coalesce(:probe_recipient, probe_recipient),
       next_probe_at = CASE WHEN status = 'down' AND NOT :probe
                             AND reason IS NOT DISTINCT FROM :reason THEN next_probe_at
           ELSE now() + make_interval(secs => CASE WHEN :reason = 'login'
           THEN :login_interval
           ELSE least(:probe_max, power(2, least(failures, 10))) END) END,
       updated_at = now()
 WHERE id = :relay
RETURNING failures
""")


def mark_relay_down(conn: Connection, error: str, *, login: bool = False,
                    fingerprint: str | None = None, probe_recipient: str | None = None,
                    login_interval: float = 300, probe_max: float = 60,
                    probe: bool = False, relay: int = 1) -> int:
    """Pause all delivery and probe with backoff (``login``: the relay refused our
    credentials -- probed at most every ``login_interval`` seconds). ``probe_recipient``:
    the probe also asks RCPT for this address (a refusal reported only at RCPT).
    ``probe``: this failure is a probe's (it escalates the backoff); a drain thread's
    failure while the relay is already down counts once. Returns the failure count."""
    return int(conn.execute(_RELAY_DOWN, {
        "error": error[:1000], "reason": "login" if login else None,
        "fingerprint": fingerprint, "probe_recipient": probe_recipient,
        "login_interval": float(login_interval), "probe_max": float(probe_max),
        "probe": probe, "relay": relay}).scalar_one())


def mark_relay_ok(conn: Connection, relay: int = 1) -> bool:
    """Resume delivery through ``relay``. Returns True if it had been down."""
    row = conn.execute(sa.text("""
        UPDATE relay_state SET status = 'ok', failures = 0, next_probe_at = NULL,
               reason = NULL, probe_recipient = NULL, updated_at = now(), since = now()
         WHERE id = :relay AND status = 'down' RETURNING id"""), {"relay": relay}).first()
    return row is not None


# Exactly one process probes a down relay at a time: it moves next_probe_at forward first.
_TAKE_PROBE = sa.text("""
UPDATE relay_state
   SET next_probe_at = now() + make_interval(secs => CASE WHEN reason = 'login'
           THEN :login_interval ELSE least(:probe_max, power(2, least(failures, 10))) END)
 WHERE id = :relay AND status = 'down' AND (next_probe_at IS NULL OR next_probe_at <= now())
RETURNING id
""")


def take_probe_turn(conn: Connection, login_interval: float = 300,
                    probe_max: float = 60, relay: int = 1) -> bool:
    return conn.execute(_TAKE_PROBE, {"login_interval": float(login_interval),
                                      "probe_max": float(probe_max),
                                      "relay": relay}).first() is not None


def probe_now(conn: Connection) -> bool:
    """An admin's "Retry now": every relay that is down is probed at once. True if one
    was down."""
    row = conn.execute(sa.text("UPDATE relay_state SET next_probe_at = now() "
                               "WHERE status = 'down' RETURNING id")).first()
    return row is not None


def note_smtp_url(conn: Connection, fingerprint: str, relay: int = 1) -> bool:
    """At start: if the relay is down because of a *different* SMTP URL (say, the password
    was fixed), probe at once instead of waiting out the old backoff. True if so."""
    row = conn.execute(sa.text("""
        UPDATE relay_state SET next_probe_at = now()
         WHERE id = :relay AND status = 'down' AND smtp_fingerprint IS DISTINCT FROM :fp
        RETURNING id"""), {"fp": fingerprint, "relay": relay}).first()
    return row is not None


def ensure_relays(conn: Connection, relays: int) -> None:
    """A ``relay_state`` row for each of the configured relays (1..relays)."""
    conn.execute(sa.text("INSERT INTO relay_state (id, status) SELECT i, 'ok' "
                         "FROM generate_series(1, :n) i ON CONFLICT (id) DO NOTHING"),
                 {"n": relays})


def relay_states(conn: Connection, relays: int) -> list[dict[str, Any]]:
    """The state of each configured relay (1..relays), in order; a relay no worker has
    used yet is ok."""
    return [relay_status(conn, i) for i in range(1, relays + 1)]


def relay_status(conn: Connection, relay: int = 1) -> dict[str, Any]:
    row = conn.execute(sa.text("""
        SELECT r.*, coalesce(r.throttled_until > now(), false) AS paused,
               l.paced_rate, coalesce(r.throttled_until > now(), false)
                             OR l.paced_rate IS NOT NULL AS throttled
          FROM relay_state r LEFT JOIN rate_limiter l ON l.id = 1 WHERE r.id = :relay"""),
                       {"relay": relay}).mappings().first()
    return dict(row) if row else {"id": relay, "status": "ok", "throttled": False,
                                  "paused": False, "paced_rate": None}


# --- throttling (docs/design.md §16, §17): slow down, never fail ----------------------------------
# A relay that throttles us is paced (AIMD, on the shared rate limiter's row): its rate is
# halved at most once per second -- threads that see the same reply at the same moment
# count once -- and grows back by a step per clean PACE_CLEAN_INTERVAL; nothing stops. A
# relay that closes the channel (421) is also paused, and a recipient domain that throttles
# us waits alone: the n-th pause in a row lasts backoff[n-1] seconds (the last step
# repeats), and a pause lengthens only when a reply *after* the previous pause ended says
# the same again (compare-and-set on the row: replies during a pause change nothing).

PACE_FLOOR = 0.05  # messages per second: never slower than one every 20 s
PACE_CLEAN_INTERVAL = 2.0  # seconds without a throttle reply before the rate grows a step
PACE_STEPS = 5  # the rate grows back to where it was first halved from in this many steps
PACE_MEASURE = 5.0  # seconds of sends the first halving measures the rate over
PACE_START = 2.0  # the rate the first halving assumes when fewer were measured
# A relay that counts per fixed window (Postfix's anvil) refuses everything until its
# window ends, however slowly we send: halving on each refusal would fall far below what
# it accepts. So a halving never goes below the rate the relay accepted over the last
# PACE_ACCEPTED seconds (it demonstrably takes that much).
PACE_ACCEPTED = 10.0

_PACE_DOWN = sa.text(f"""
WITH measured AS (
    SELECT greatest(count(*) / {PACE_MEASURE}, {PACE_START}) AS rate FROM delivery_jobs
     WHERE status = '{SENT}' AND finished_at > now() - make_interval(secs => {PACE_MEASURE})
), accepted AS (
    SELECT count(*) / {PACE_ACCEPTED} AS rate FROM delivery_jobs
     WHERE status = '{SENT}' AND finished_at > now() - make_interval(secs => {PACE_ACCEPTED})
), cur AS (
    SELECT least(coalesce(l.paced_rate, CASE WHEN :limit > 0 THEN :limit
                                             ELSE (SELECT rate FROM measured) END),
                 CASE WHEN :limit > 0 THEN :limit ELSE 'infinity'::float8 END) AS rate
      FROM rate_limiter l WHERE id = 1
)
UPDATE rate_limiter l
   SET paced_rate = greatest((SELECT rate FROM cur) / 2, (SELECT rate FROM accepted),
                             {PACE_FLOOR}),
       paced_step = coalesce(l.paced_step,
                             greatest((SELECT rate FROM cur) / {PACE_STEPS}, {PACE_FLOOR})),
       paced_at = now()
 WHERE id = 1 AND (l.paced_at IS NULL OR l.paced_rate IS NULL
                   OR l.paced_at <= now() - interval '1 second')
RETURNING paced_rate
""")

_THROTTLE_RELAY = sa.text("""
UPDATE relay_state
   SET throttle_hits = throttle_hits + CASE WHEN :counted THEN 1 ELSE 0 END,
       throttle_reply = :reply, updated_at = now()
 WHERE id = :relay
""")

# 421: the relay closed the channel. A pause, escalated once per cycle (see above).
_PAUSE_RELAY = sa.text("""
UPDATE relay_state
   SET pause_hits = CASE WHEN throttled_until > now() - interval '10 minutes'
                         THEN pause_hits + 1 ELSE 1 END
 WHERE id = :relay AND (throttled_until IS NULL OR throttled_until <= now())
RETURNING pause_hits
""")


def throttle_relay(conn: Connection, reply: str, backoff: Sequence[int], *,
                   rate_limit: float = 0, pause: bool = False,
                   relay: int = 1) -> float | None:
    """The relay throttles us: halve the paced send rate of every process (at most once a
    second; the first time from the rate measured over the last seconds, never above
    ``rate_limit`` when one is set). ``pause`` (a 421: the relay closed the channel): also
    stop claiming for the next backoff step, escalated once per pause cycle. Returns the
    rate in force when this call lowered it, else None."""
    rate = conn.execute(_PACE_DOWN, {"limit": float(rate_limit)}).scalar()
    hits = conn.execute(_PAUSE_RELAY, {"relay": relay}).scalar() if pause else None
    if hits is not None:
        delay = float(backoff[min(int(hits), len(backoff)) - 1])
        conn.execute(sa.text("UPDATE relay_state SET throttled_until = now() + "
                             "make_interval(secs => :d) WHERE id = :relay"),
                     {"d": delay, "relay": relay})
    conn.execute(_THROTTLE_RELAY, {"reply": reply[:1000], "relay": relay,
                                   "counted": rate is not None or hits is not None})
    return None if rate is None else float(rate)


def paced_rate(conn: Connection) -> float | None:
    """The rate a throttling relay is paced at now (None: not paced)."""
    value = conn.execute(sa.text("SELECT paced_rate FROM rate_limiter WHERE id = 1")).scalar()
    return None if value is None else float(value)


def reset_pacing(conn: Connection) -> None:
    conn.execute(sa.text("UPDATE rate_limiter SET paced_rate = NULL, paced_step = NULL, "
                         "paced_at = NULL WHERE id = 1"))
