"""The one way into the queue for messages to one person (the package creates every job,
nowhere else does: tests/unit/test_layout.py). :func:`enqueue` serves ``POST /messages``,
``POST /messages/batch``, ``POST /verifications``, a resend, a kind's or a campaign's test
send, the SMTP submission. It takes a list of :class:`Ask` and answers a list of
:class:`Result`, in order, in **one statement** (one round trip) whatever the list's
length: the asks are sent as one JSON array that PostgreSQL parses once
(``jsonb_to_recordset``), and every per-message rule is a CTE of that statement. A
campaign's audience and a sequence's steps enter through
:mod:`workers.queue.enqueue_audience`.

The per-message rules, all in the database so they hold across processes:

- an idempotency key returns the message it created, whatever its state
  (``delivery_jobs_idempotency_idx``);
- ``one_live``: one live job per user and kind (``delivery_jobs_one_active_idx``); the
  live job answers a second ask (``live``); an ask with ``replace_id`` cancels that job if
  it is still waiting and takes its place;
- ``dedupe_window``: one message per user, kind and window (``delivery_jobs_dedupe_excl``);
  the message that opened the window answers (``dedupe_window``);
- ``cooldown``: no second message of the kind to one address inside the cooldown since the
  last one was created, sent or resent, whoever asks: per user (that user's latest job)
  **and** per address (lower-cased and trimmed, any user id: ``delivery_jobs_email_idx``);
  answered ``cooldown`` with the seconds left; at once: ``delivery_jobs_cooldown_excl`` on
  ``cooldown_until``. Two asks of one call for one address: the second waits (``busy``);
- the backlog limit: past ``max_backlog`` transactional jobs waiting, an ask is ``full``;
- suppression: an address on the suppression list gets the ``suppressed`` flag (the
  worker finishes it without sending);
- ``version``: the kind's row as the caller read it; changed since, the ask is ``stale``;
- each new job's audit row (``audit``: its action) is written by the same statement;
- idle workers are woken once per kind (``pg_notify``): at the caller's commit inside a
  transaction, else by :mod:`workers.queue.wakes` (why: see there).

A lost race (a conflicting ask committed after this statement's snapshot) inserts nothing
and answers ``busy``: the caller asks again and the next statement sees the winner
(webapp/domain/intake.py does, at most four times).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from workers.core import fastjson, pg
from workers.core.states import (
    ACTIVE,
    CANCELLED,
    HELD,
    PENDING,
    PRIORITY,
    SENT,
    WAITING,
    sql_list,
)
from workers.queue.campaigns import TRANSACTIONAL_BACKLOG_COUNT
from workers.queue.common import JOB_COLUMNS, JOB_FIELDS, job_columns
from workers.queue.wakes import WAKER


@dataclass(frozen=True)
class KindVersion:
    """A kind's row as the caller read it (``kinds``): the statement answers ``stale``
    when the row changed since, so no message goes out under old rules."""

    version: int
    kind_class: str
    dedupe_window: int
    resend_cooldown: int | None


@dataclass(frozen=True)
class Ask:
    """One message asked for, already validated by its caller.

    ``cooldown`` (seconds) holds per user and per address; ``one_live`` one live job per
    user; ``dedupe_window`` (seconds, 0: none) one message per user and window; ``hold``
    creates it ``held`` for support; ``flags`` are what the caller found about the address
    (``suppressed`` is added here); ``audit`` is the action of its audit row (None: the
    caller writes its own)."""

    kind: str
    email: str
    priority: int
    payload: dict[str, Any]
    user_ref: str | None = None
    key: str | None = None
    flags: tuple[str, ...] = ()
    hold: bool = False
    send_at: datetime | None = None
    dedupe_window: int = 0
    cooldown: int | None = None
    one_live: bool = False
    replace_id: int | None = None
    audit: str | None = None
    version: KindVersion | None = None


@dataclass
class Result:
    """What became of one :class:`Ask`. ``outcome``: ``new`` (``job`` is it), an earlier
    job that answers it (``idempotency_key``, ``live``, ``dedupe_window``, ``cooldown``
    with ``wait`` seconds left; ``job`` is that job, ``priority`` its priority), or nothing
    done: ``stale``, ``full`` (the backlog), ``busy`` (a lost race: ask again)."""

    outcome: str
    job: dict[str, Any] | None = None
    wait: float | None = None
    priority: int | None = None
    woken: list[str] = field(default_factory=list)


# A new job comes back as columns, without its payload: the payload is the one the
# statement was given (as jsonb it is the same value), and reading 500 of them back as
# JSON was the largest part of a batch's Python.
_NEW_NAMES = [name for name in JOB_FIELDS if name != "payload"]
_NEW_COLUMNS = job_columns(without=("payload",))

_ITEM = """item AS (
    SELECT x.i, k.name AS kind, k.priority, k.version, k.kind_class, k.dedupe_window,
           k.kind_cooldown, x.user_ref, x.email, lower(btrim(x.email)) AS address, x.key,
           x.payload, coalesce(x.flags, '[]') AS flags, coalesce(x.hold, false) AS hold,
           x.send_at, k.one_live, k.cooldown, x.replace_id, k.action,
           row_number() OVER (PARTITION BY k.name, lower(btrim(x.email)) ORDER BY x.i) AS twin
      FROM jsonb_to_recordset(CAST(%(items)s AS jsonb)) AS x(
               i int, k int, user_ref text, email text, key text, payload jsonb,
               flags jsonb, hold boolean, send_at timestamptz, replace_id bigint)
      JOIN jsonb_to_recordset(CAST(%(kinds)s AS jsonb)) AS k(
               k int, name text, priority int, version int, kind_class text,
               dedupe_window int, kind_cooldown int, one_live boolean, cooldown int,
               action text)
        ON k.k = x.k
)"""

_STALE = """stale AS (
    SELECT i.i FROM item i
     WHERE i.version IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM kinds k
                        WHERE k.name = i.kind AND k.version = i.version AND k.active
                          AND k.class = i.kind_class AND k.dedupe_window = i.dedupe_window
                          AND coalesce(k.resend_cooldown, -1) = i.kind_cooldown)
)"""

# Each ask's earlier answer, by the same predicates as the constraints that guard the
# insert, the first that applies. The cooldown is looked up twice: the user's latest job
# (to this address), and the address's latest job of the kind whoever asked for it: the
# address index (`kind <> 'broadcast'` is its predicate, spelled out so the planner may
# use it), behind a fence (OFFSET 0) so the kind is not looked up first: on a table just
# grown the planner chose delivery_jobs_kind_created_idx, reading every job of the kind
# for each ask (0.7 ms an ask at 2,500 jobs, growing).
_LAST = (f"greatest(j.created_at, CASE WHEN j.status = '{SENT}' THEN j.finished_at END, "
         "CAST(j.payload ->> 'resent_at' AS timestamptz))")
_EARLIER = f"""earlier AS (
    SELECT i.i, e.id, e.why, e.wait FROM item i CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT j.id, 'idempotency_key' AS why, NULL::float8 AS wait, 1 AS rank
               FROM delivery_jobs j
              WHERE i.key IS NOT NULL AND j.kind = i.kind AND j.idempotency_key = i.key)
            UNION ALL
            (SELECT j.id, 'live', NULL, 2 FROM delivery_jobs j
              WHERE i.one_live AND j.kind = i.kind AND j.user_ref = i.user_ref
                AND j.status IN {sql_list(ACTIVE)} AND j.id IS DISTINCT FROM i.replace_id)
            UNION ALL
            (SELECT j.id, 'dedupe_window', NULL, 3 FROM delivery_jobs j
              WHERE i.dedupe_window > 0 AND j.kind = i.kind AND j.user_ref = i.user_ref
                AND j.dedupe_until > now() AND j.status <> '{CANCELLED}'
              ORDER BY j.created_at DESC, j.id DESC LIMIT 1)
            UNION ALL
            (SELECT l.id, 'cooldown',
                    extract(epoch FROM l.last + make_interval(secs => i.cooldown) - now()), 4
               FROM (SELECT j.id, j.email, {_LAST} AS last
                       FROM delivery_jobs j
                      WHERE i.cooldown IS NOT NULL AND j.kind = i.kind
                        AND j.user_ref = i.user_ref AND j.status <> '{CANCELLED}'
                      ORDER BY j.created_at DESC, j.id DESC LIMIT 1) l
              WHERE lower(l.email) = i.address
                AND l.last + make_interval(secs => i.cooldown) > now())
            UNION ALL
            (SELECT l.id, 'cooldown', extract(epoch FROM l.until - clock_timestamp()), 5
               FROM (SELECT j.id, greatest({_LAST} + make_interval(secs => i.cooldown),
                                           j.cooldown_until) AS until
                       FROM (SELECT * FROM delivery_jobs a
                              WHERE i.cooldown IS NOT NULL AND lower(a.email) = i.address
                                AND a.kind <> 'broadcast' OFFSET 0) j
                      WHERE j.kind = i.kind AND j.status <> '{CANCELLED}'
                        AND j.id IS DISTINCT FROM i.replace_id
                      ORDER BY 2 DESC LIMIT 1) l
              WHERE l.until > now())
        ) c ORDER BY rank LIMIT 1) e
     WHERE i.i NOT IN (SELECT i FROM stale)
)"""

# The asks left; one asked earlier in the same call for the same address and a kind with a
# cooldown waits for the next round (it will find this one's job). The correlation id is
# also how the rows the insert returns find their ask.
_FRESH = """fresh AS (
    SELECT i.*, row_number() OVER (ORDER BY i.i) AS nth,
           gen_random_uuid() AS correlation_id FROM item i
     WHERE i.i NOT IN (SELECT i FROM stale) AND i.i NOT IN (SELECT i FROM earlier)
       AND (i.cooldown IS NULL OR i.twin < 2)  -- not `= 1`: estimated at 0.5 rows, the
                                                -- joins below became nested loops
)"""

# Admitted while the backlog has room (no limit: NULL).
_ADMITTED = f"""admitted AS (
    SELECT f.* FROM fresh f
     WHERE CAST(%(max_backlog)s AS bigint) IS NULL
        OR ({TRANSACTIONAL_BACKLOG_COUNT}) + f.nth <= CAST(%(max_backlog)s AS bigint)
)"""

# Only in the statement for asks that replace a job: an UPDATE, even of no row, runs the
# jobs table's statement triggers (counts, outcomes, event webhooks), which the common
# case skips. The insert reads `replaced`, so the old job has left the one-live index
# before the new row is checked against it.
_REPLACED = f"""replaced AS (
    UPDATE delivery_jobs j
       SET status = '{CANCELLED}', finished_at = now(), last_error_class = '{CANCELLED}',
           last_error = 'replaced: the user asked again for another address'
      FROM admitted a
     WHERE j.id = a.replace_id AND j.status IN {sql_list(WAITING)}
    RETURNING j.id
)"""


def _inserted(admit: str) -> str:
    return f"""inserted AS (
    INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, idempotency_key,
                               payload, flags, requested_by, available_at, dedupe_until,
                               cooldown_until, correlation_id)
    SELECT a.kind, a.priority, CASE WHEN a.hold THEN '{HELD}' ELSE '{PENDING}' END, a.email,
           a.user_ref, a.key, a.payload,
           a.flags || CASE WHEN NOT a.flags ? 'suppressed' AND EXISTS (
                               SELECT 1 FROM suppressions s WHERE s.email = lower(a.email))
                           THEN '["suppressed"]'::jsonb ELSE '[]'::jsonb END,
           %(actor)s, coalesce(a.send_at, now()),
           CASE WHEN a.dedupe_window > 0 THEN now() + make_interval(secs => a.dedupe_window)
           END, CASE WHEN a.cooldown > 0 THEN now() + make_interval(secs => a.cooldown) END,
           a.correlation_id
      FROM admitted a
     WHERE {admit}
    ON CONFLICT DO NOTHING
    RETURNING {_NEW_COLUMNS}
)"""


_AUDITED = """audited AS (
    INSERT INTO audit_log (actor, action, target, details)
    SELECT %(actor)s, a.action, 'user:' || a.user_ref,
           jsonb_build_object('kind', a.kind, 'email', a.email,
                              'send_at', a.payload -> 'send_at',
                              'event', a.payload -> 'event' -> 'name',
                              'event_id', a.payload -> 'event' -> 'id',
                              'job_id', n.id, 'status', n.status, 'flags', n.flags,
                              'replaced_job_id', a.replace_id)
      FROM inserted n JOIN admitted a ON a.correlation_id = CAST(n.correlation_id AS uuid)
     WHERE a.action IS NOT NULL
    RETURNING 1
)"""

_WOKEN = f"""woken AS (
    SELECT k.kind, CASE WHEN %(notify)s THEN pg_notify('senddock_jobs', k.kind) END
      FROM (SELECT DISTINCT n.kind FROM inserted n
             WHERE n.status = '{PENDING}' AND n.available_at <= now()) k
)"""

_ANSWER = f"""
SELECT i.i,
       CASE WHEN s.i IS NOT NULL THEN 'stale' WHEN e.id IS NOT NULL THEN e.why
            WHEN n.id IS NOT NULL THEN 'new'
            WHEN f.i IS NOT NULL AND a.i IS NULL THEN 'full' ELSE 'busy' END AS outcome,
       e.wait, {", ".join(f"n.{c}" for c in _NEW_NAMES)},
       (SELECT to_jsonb(d) FROM (SELECT {JOB_COLUMNS}, priority FROM delivery_jobs
                                  WHERE id = e.id) d) AS earlier,
       (SELECT array_agg(kind) FROM woken) AS woken
  FROM item i
  LEFT JOIN stale s ON s.i = i.i
  LEFT JOIN earlier e ON e.i = i.i
  LEFT JOIN fresh f ON f.i = i.i
  LEFT JOIN admitted a ON a.i = i.i
  LEFT JOIN inserted n ON CAST(n.correlation_id AS uuid) = a.correlation_id
 ORDER BY i.i
"""

#: The statement of the common case, and of a call where some ask replaces a job.
ENQUEUE = (f"WITH {_ITEM}, {_STALE}, {_EARLIER}, {_FRESH}, {_ADMITTED}, "
           f"{_inserted('true')}, {_AUDITED}, {_WOKEN}{_ANSWER}")
ENQUEUE_REPLACING = (
    f"WITH {_ITEM}, {_STALE}, {_EARLIER}, {_FRESH}, {_ADMITTED}, {_REPLACED}, "
    f"{_inserted('a.replace_id IS NULL OR a.replace_id IN (SELECT id FROM replaced)')}, "
    f"{_AUDITED}, {_WOKEN}{_ANSWER}")

_NATIVE, _NATIVE_REPLACING = pg.NativeStatement(ENQUEUE), pg.NativeStatement(ENQUEUE_REPLACING)

_TIMES = ("created_at", "available_at", "finished_at")


def _kind_row(ask: Ask, k: int) -> dict[str, Any]:
    row: dict[str, Any] = {"k": k, "name": ask.kind, "priority": ask.priority,
                           "dedupe_window": ask.dedupe_window, "one_live": ask.one_live}
    if ask.cooldown is not None:
        row["cooldown"] = ask.cooldown
    if ask.audit is not None:
        row["action"] = ask.audit
    if ask.version is not None:
        row.update(version=ask.version.version, kind_class=ask.version.kind_class,
                   kind_cooldown=-1 if ask.version.resend_cooldown is None
                   else ask.version.resend_cooldown)
    return row


def _kind_key(ask: Ask) -> tuple[Any, ...]:
    return (ask.kind, ask.priority, ask.dedupe_window, ask.one_live, ask.cooldown, ask.audit,
            ask.version)


def _item(ask: Ask, i: int, k: int) -> dict[str, Any]:
    """One ask as the statement reads it (a missing key is NULL to jsonb_to_recordset)."""
    row: dict[str, Any] = {"i": i, "k": k, "email": ask.email, "payload": ask.payload}
    if ask.user_ref is not None:
        row["user_ref"] = ask.user_ref
    if ask.flags:
        row["flags"] = list(ask.flags)
    if ask.hold:
        row["hold"] = True
    if ask.key is not None:
        row["key"] = ask.key
    if ask.send_at is not None:
        row["send_at"] = ask.send_at.isoformat()
    if ask.replace_id is not None:
        row["replace_id"] = ask.replace_id
    return row


def _earlier(value: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int | None]:
    if value is None:
        return None, None
    for name in _TIMES:
        if isinstance(value.get(name), str):
            value[name] = datetime.fromisoformat(value[name])
    return value, value.pop("priority", None)


def enqueue(conn: Connection, asks: list[Ask], *, actor: str | None,
            max_backlog: int | None = None) -> list[Result]:
    """Answer every ask, in order, in one statement (see the module's docstring). Runs in
    ``conn``'s transaction (its workers are woken at its commit) or, in autocommit, is
    committed when it returns (and the process's waker wakes the workers, only when a job
    is due now). ``actor`` is the jobs' ``requested_by`` and the audit rows' actor;
    ``max_backlog`` the transactional backlog limit (None: none)."""
    if not asks:
        return []
    committed = bool(conn.connection.driver_connection.autocommit)  # type: ignore[union-attr]
    kinds: dict[tuple[Any, ...], int] = {}
    kind_rows: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    for i, ask in enumerate(asks):
        key = _kind_key(ask)
        k = kinds.get(key)
        if k is None:
            k = kinds[key] = len(kind_rows)
            kind_rows.append(_kind_row(ask, k))
        items.append(_item(ask, i, k))
    replacing = any(ask.replace_id is not None for ask in asks)
    names, rows = pg.driver_tuples(conn, _NATIVE_REPLACING if replacing else _NATIVE, {
        "items": fastjson.dumps(items, default=str) or json.dumps(items, default=str),
        "kinds": json.dumps(kind_rows), "actor": actor, "max_backlog": max_backlog,
        "notify": not committed})
    at = {name: n for n, name in enumerate(names)}
    new_at = [(name, at[name]) for name in _NEW_NAMES]
    woken = (rows[0][at["woken"]] or []) if rows else []
    if committed and woken:
        WAKER.wake(conn.engine, woken)
    results = []
    for row in rows:
        outcome = row[at["outcome"]]
        if outcome == "new":
            job = {name: row[n] for name, n in new_at}
            job["payload"] = asks[row[at["i"]]].payload
            results.append(Result("new", job, woken=woken))
        else:
            earlier, priority = _earlier(row[at["earlier"]])
            results.append(Result(outcome, earlier, row[at["wait"]], priority, woken))
    return results


def enqueue_one(conn: Connection, ask: Ask, *, actor: str | None,
                max_backlog: int | None = None) -> Result:
    """:func:`enqueue` of one ask."""
    return enqueue(conn, [ask], actor=actor, max_backlog=max_backlog)[0]


def enqueue_test(conn: Connection, email: str, payload: dict[str, Any], *,
             actor: str | None) -> int:
    """Queue a ``test`` job (a kind's or a campaign's test send: served first, counted
    nowhere); returns its id. It has no user and no key, so nothing can refuse it."""
    result = enqueue_one(conn, Ask("test", email, PRIORITY["test"], payload), actor=actor)
    assert result.outcome == "new" and result.job is not None, result
    return int(result.job["id"])
