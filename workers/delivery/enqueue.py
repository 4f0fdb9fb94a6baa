"""The one way into the queue: every job is created here, and nowhere else
(tests/unit/test_layout.py). Two entry points:

- :func:`enqueue` for messages to one person: ``POST /messages``, ``POST /messages/batch``,
  ``POST /verifications``, a resend, a kind's or a campaign's test send, the SMTP
  submission. It takes a list of :class:`Ask` and answers a list of :class:`Result`, in
  order, in **one statement** (one round trip) whatever the list's length: the asks are
  sent as one JSON array that PostgreSQL parses once (``jsonb_to_recordset``), and every
  per-message rule is a CTE of that statement;
- :func:`enqueue_chunk` / :func:`enqueue_broadcast` for a campaign's audience.

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
  answered ``cooldown`` with the seconds left. Two asks of one call for one address: the
  first is inserted, the second waits for the caller's next round (``busy``);
- the backlog limit: past ``max_backlog`` transactional jobs waiting, an ask is ``full``;
- suppression: an address on the suppression list gets the ``suppressed`` flag (the
  worker finishes it without sending);
- ``version``: the kind's row as the caller read it; changed since, the ask is ``stale``;
- each new job's audit row (``audit``: its action) is written by the same statement;
- idle workers are woken once per kind (``pg_notify``): at the caller's commit inside a
  transaction, or by a statement of its own just after an autocommitted one (in the
  insert's commit PostgreSQL's notify lock serialized every request's commit: 600-810
  commits/s without it, 165-190 with it, pgbench on 2 cores).

A lost race (a conflicting ask committed after this statement's snapshot) inserts nothing
and answers ``busy``: the caller asks again and the next statement sees the winner
(webapp/domain/intake.py does, at most four times).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.core import fastjson, pg
from workers.core.states import (
    ACTIVE,
    CANCELLED,
    HELD,
    PENDING,
    SENT,
    WAITING,
    sql_list,
)
from workers.delivery import audience
from workers.delivery.queue import (
    JOB_COLUMNS,
    JOB_FIELDS,
    PRIORITY,
    TRANSACTIONAL_BACKLOG_COUNT,
    Campaign,
    custom_plan,
    job_columns,
)

#: The kind of a sequence's email step (workers.delivery.sequences).
SEQUENCE = "sequence"


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
            (SELECT l.id, 'cooldown',
                    extract(epoch FROM l.last + make_interval(secs => i.cooldown) - now()), 5
               FROM (SELECT j.id, {_LAST} AS last
                       FROM (SELECT * FROM delivery_jobs a
                              WHERE i.cooldown IS NOT NULL AND lower(a.email) = i.address
                                AND a.kind <> 'broadcast' OFFSET 0) j
                      WHERE j.kind = i.kind AND j.status <> '{CANCELLED}'
                        AND j.id IS DISTINCT FROM i.replace_id
                      ORDER BY 2 DESC LIMIT 1) l
              WHERE l.last + make_interval(secs => i.cooldown) > now())
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
                               correlation_id)
    SELECT a.kind, a.priority, CASE WHEN a.hold THEN '{HELD}' ELSE '{PENDING}' END, a.email,
           a.user_ref, a.key, a.payload,
           a.flags || CASE WHEN NOT a.flags ? 'suppressed'
                                AND EXISTS (SELECT 1 FROM suppressions s
                                             WHERE s.email = lower(a.email))
                           THEN '["suppressed"]'::jsonb ELSE '[]'::jsonb END,
           %(actor)s, coalesce(a.send_at, now()),
           CASE WHEN a.dedupe_window > 0 THEN now() + make_interval(secs => a.dedupe_window)
           END, a.correlation_id
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

# The wake of an autocommitted statement, in a transaction of its own (see the module's
# docstring): a transaction that only notifies writes nothing and is not flushed.
_WAKE = "SELECT pg_notify('senddock_jobs', k) FROM unnest(CAST(%(kinds)s AS text[])) k"

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
    committed when it returns (and the workers are woken by one more statement, only when a
    job is due now). ``actor`` is the jobs' ``requested_by`` and the audit rows' actor;
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
    rows = pg.driver_rows(conn, ENQUEUE_REPLACING if replacing else ENQUEUE, {
        "items": fastjson.dumps(items, default=str) or json.dumps(items, default=str),
        "kinds": json.dumps(kind_rows), "actor": actor, "max_backlog": max_backlog,
        "notify": not committed})
    woken = (rows[0]["woken"] or []) if rows else []
    if committed and woken:
        pg.driver_rows(conn, _WAKE, {"kinds": woken})
    results = []
    for row in rows:
        ask = asks[row["i"]]
        if row["outcome"] == "new":
            results.append(Result("new", {**{c: row[c] for c in _NEW_NAMES},
                                          "payload": ask.payload}, woken=woken))
            continue
        job, priority = _earlier(row["earlier"])
        results.append(Result(row["outcome"], job, row["wait"], priority, woken))
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


# --- a campaign's audience ------------------------------------------------------------
# One statement per chunk of a broadcast: it reads the next `chunk` members of the
# campaign's list after the broadcast's cursor (enqueued_upto), inserts the jobs of the
# active, unsuppressed ones, adds the skipped ones to the broadcast's audience summary and
# moves the cursor, all in the caller's transaction. Each chunk reads its members along
# memberships' primary key and the subscribers by theirs, so its cost and memory do not
# grow with the list (one 10M-row statement spilled its hash join, its materialized
# audience and the count trigger's transition table to disk). The two primary keys are
# walked side by side (a merge join; 0.56 s for a 1M chunk, where first materializing the
# members and hashing the subscribers took 2 s). The chunk that finds fewer members than
# asked stamps enqueued_at. (The lower bound on subscribers starts their walk at the
# cursor: without it every chunk read the table from its start.) The span of the ids it
# created is recorded too (the settler of a cancel walks it). The row lock (SKIP LOCKED)
# keeps two processes off the same broadcast; a crash rolls back only the chunk in
# progress, and the next run goes on from the cursor. Jobs can be claimed from the first
# chunk on.
_ENQUEUE_CHUNK = f"""
WITH b AS (
    SELECT b.id, b.campaign_id, b.enqueued_upto, c.list_id
      FROM broadcasts b JOIN campaigns c ON c.id = b.campaign_id
     WHERE b.id = :broadcast_id AND b.enqueued_at IS NULL
       AND c.status IN {{started}}
       FOR UPDATE OF b SKIP LOCKED
), audience AS MATERIALIZED (
    SELECT s.id, s.email, s.status,
           EXISTS (SELECT 1 FROM suppressions x WHERE x.email = lower(s.email)) AS suppressed,
           {{chosen}} AS chosen
      FROM memberships m JOIN subscribers s ON s.id = m.subscriber_id
     WHERE m.list_id = (SELECT list_id FROM b)
       AND m.subscriber_id > (SELECT enqueued_upto FROM b)
       AND s.id > (SELECT enqueued_upto FROM b)
     ORDER BY m.subscriber_id LIMIT :chunk
), ins AS (
    INSERT INTO delivery_jobs (kind, priority, status, email, broadcast_id, campaign_id,
                               subscriber_id)
    SELECT 'broadcast', :priority, '{PENDING}', a.email, b.id, b.campaign_id, a.id
      FROM audience a, b
     WHERE a.chosen AND a.status = 'active' AND NOT a.suppressed
    RETURNING id
), made AS (
    SELECT count(*) AS n, min(id) AS first_id, max(id) AS last_id FROM ins
), summary AS (
    SELECT (SELECT n FROM made) AS total,
           (SELECT first_id FROM made) AS first_id, (SELECT last_id FROM made) AS last_id,
           count(*) FILTER (WHERE chosen AND suppressed) AS skipped_suppressed,
           count(*) FILTER (WHERE chosen AND NOT suppressed AND status <> 'active')
               AS skipped_inactive,
           count(*) AS seen, max(id) AS upto
      FROM audience
)
UPDATE broadcasts SET total = broadcasts.total + summary.total,
       skipped_suppressed = broadcasts.skipped_suppressed + summary.skipped_suppressed,
       skipped_inactive = broadcasts.skipped_inactive + summary.skipped_inactive,
       enqueued_upto = coalesce(summary.upto, broadcasts.enqueued_upto),
       first_job_id = least(broadcasts.first_job_id, summary.first_id),
       last_job_id = greatest(broadcasts.last_job_id, summary.last_id),
       enqueued_at = CASE WHEN summary.seen < :chunk THEN now() END
  FROM summary, b WHERE broadcasts.id = b.id
RETURNING broadcasts.total, broadcasts.skipped_suppressed, broadcasts.skipped_inactive,
          broadcasts.enqueued_at IS NOT NULL AS done, summary.total AS added
"""
# A segmented broadcast goes through the same statement: its frozen conditions become the
# `chosen` column (workers.delivery.audience: whitelisted fragments, bound values), so
# members outside the segment are read, not enqueued and not counted as skipped, and the
# cursor still walks the whole list. The whole list's `chosen` is `true`, and only a date
# condition reads the membership's date (the primary key alone, an index-only scan, serves
# the rest).
_WHOLE_LIST = sa.text(_ENQUEUE_CHUNK.format(started=sql_list(Campaign.STARTED), chosen="true"))
_AUDIENCE_FILTER = sa.text("SELECT audience_filter FROM broadcasts WHERE id = :id")


def _chunk_statement(conn: Connection, broadcast_id: int
                     ) -> tuple[sa.TextClause, dict[str, Any]]:
    conditions = conn.execute(_AUDIENCE_FILTER, {"id": broadcast_id}).scalar()
    if not conditions:
        return _WHOLE_LIST, {}
    chosen, params = audience.predicate(conditions)
    return sa.text(_ENQUEUE_CHUNK.format(started=sql_list(Campaign.STARTED),
                                         chosen=f"({chosen})")), params


#: Members per enqueue chunk. Measured at 1M on a loaded machine (load 8-14, so only
#: roughly): chunks of 200,000 and 50,000 were slower than one statement, a chunk of
#: 1,000,000 the same; so a list of up to a million is one statement, and ten million are
#: ten statements of the size that ran at 137,841/s, instead of one that spills to disk
#: (71,000/s).
ENQUEUE_CHUNK = 1_000_000


@dataclass
class EnqueueStep:
    total: int
    skipped_suppressed: int
    skipped_inactive: int
    added: int  # jobs this chunk created
    done: bool  # the whole audience is enqueued

    def summary(self) -> dict[str, int]:
        return {"total": self.total, "skipped_suppressed": self.skipped_suppressed,
                "skipped_inactive": self.skipped_inactive}


def enqueue_chunk(conn: Connection, broadcast_id: int,
                  chunk: int = ENQUEUE_CHUNK) -> EnqueueStep | None:
    """Create the jobs of the broadcast's next ``chunk`` members. None when the broadcast
    is already enqueued, not sending, or another process holds it right now."""
    custom_plan(conn)  # each chunk planned for its own place in the list
    statement, params = _chunk_statement(conn, broadcast_id)
    row = conn.execute(statement, {**params, "broadcast_id": broadcast_id, "chunk": chunk,
                                   "priority": PRIORITY["broadcast"]}).first()
    if row is None:
        return None
    return EnqueueStep(row.total, row.skipped_suppressed, row.skipped_inactive, row.added,
                       row.done)


def enqueue_broadcast(conn: Connection, broadcast_id: int,
                      chunk: int = ENQUEUE_CHUNK) -> dict[str, int] | None:
    """Create all of the broadcast's jobs in the caller's transaction (chunk after chunk).
    Returns the audience summary, or None when the broadcast is already enqueued or
    another process is enqueueing it now. The engine commits each chunk on its own."""
    step = None
    while True:
        last = enqueue_chunk(conn, broadcast_id, chunk)
        if last is None:
            return step.summary() if step is not None else None
        step = last
        if step.done:
            return step.summary()


# --- sequences (docs/sequences.md) ---------------------------------------------------
# A due email step of a sequence (workers.delivery.sequences decides which are due).
# One job per (enrollment, email step), set-based. The key `seq:<enrollment>:<step>` under
# the unique index delivery_jobs_idempotency_idx (kind, idempotency_key) is the step's
# at-most-once rule: a second insert for the same pair, from any advancer, inserts nothing.
_ENQUEUE_DUE_STEPS = sa.text(f"""
INSERT INTO delivery_jobs (kind, priority, status, email, subscriber_id, idempotency_key,
                           payload)
SELECT '{SEQUENCE}', :priority, '{PENDING}', s.email, s.id,
       'seq:' || i.enrollment_id || ':' || i.step_id,
       jsonb_build_object('sequence_id', e.sequence_id, 'enrollment_id', e.id,
                          'step_id', i.step_id, 'data', e.data)
  FROM unnest(CAST(:enrollments AS bigint[]), CAST(:steps AS bigint[]))
       WITH ORDINALITY AS i(enrollment_id, step_id, n)
  JOIN sequence_enrollments e ON e.id = i.enrollment_id
  JOIN subscribers s ON s.id = e.subscriber_id
 ORDER BY i.n
ON CONFLICT DO NOTHING
RETURNING id, idempotency_key
""")

_EXISTING_JOBS = sa.text(f"""
SELECT id, idempotency_key FROM delivery_jobs
 WHERE kind = '{SEQUENCE}' AND idempotency_key = ANY(:keys)
""")


def step_key(enrollment_id: int, step_id: int) -> str:
    return f"seq:{enrollment_id}:{step_id}"


def enqueue_due_steps(conn: Connection, sends: Sequence[tuple[int, int]]
                      ) -> dict[tuple[int, int], int]:
    """Make the job of each (enrollment, email step) in ``sends`` in the caller's
    transaction; returns each pair's job id (the existing one when the pair already had
    its job: it is never made twice)."""
    if not sends:
        return {}
    keys = {step_key(e, s): (e, s) for e, s in sends}
    made: dict[tuple[int, int], int] = {}
    for row in conn.execute(_ENQUEUE_DUE_STEPS, {
            "priority": PRIORITY[SEQUENCE], "enrollments": [e for e, _ in sends],
            "steps": [s for _, s in sends]}):
        made[keys[row.idempotency_key]] = int(row.id)
    missing = [k for k, pair in keys.items() if pair not in made]
    if missing:
        for row in conn.execute(_EXISTING_JOBS, {"keys": missing}):
            made[keys[row.idempotency_key]] = int(row.id)
    conn.execute(sa.text("SELECT pg_notify('senddock_jobs', :kind)"), {"kind": SEQUENCE})
    return made
