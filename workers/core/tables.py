"""The engine's tables (docs/design.md §11, §12): the jobs, their attempts and counts, the
suppression list, the workers' leases, the relays' state, pacing and throttles, as
SQLAlchemy Core tables on the one :data:`metadata` the whole schema shares. The web app's
tables are added to the same metadata by ``webapp/models.py``, which re-exports these, so
Alembic (``migrations/env.py``) sees every table; the migrations must produce exactly this
(``tests/integration/test_migrations.py`` compares them).

A delivery job is the unit of the whole product: one recipient, one message, one row whose
``status`` walks the states of :mod:`workers.core.states`.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID, ExcludeConstraint

from workers.core import states
from workers.core.states import sql_list

metadata = MetaData()

# The job vocabulary belongs to the engine (workers/core/states.py); the CHECK constraints and
# index predicates below are built from it.
JOB_STATUSES = states.STATES
SUPPRESSION_REASONS = ("bounced", "unsubscribed", "complaint", "manual")


def check_in(column: str, values: tuple[str, ...]) -> str:
    """A CHECK constraint's condition: ``column`` holds one of ``values``."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def created_at() -> Column:
    """The ``created_at`` column: when the row was inserted, on the database's clock."""
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now())


delivery_jobs = Table(
    "delivery_jobs", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("status", Text, nullable=False, server_default=states.PENDING),
    Column("attempts", SmallInteger, nullable=False, server_default=text("0")),
    # Counted attempts when the job was last retried by hand: the retry schedule restarts
    # there while the attempt numbers go on.
    Column("retry_base", SmallInteger, nullable=False, server_default=text("0")),
    Column("available_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("claimed_by", Text),
    Column("claim_token", UUID(as_uuid=False)),
    Column("claimed_at", DateTime(timezone=True)),
    Column("correlation_id", UUID(as_uuid=False), nullable=False,
           server_default=text("gen_random_uuid()")),
    Column("message_id", Text),
    Column("email", Text, nullable=False),
    # No foreign keys on these three on purpose: each would add a per-row lookup to the
    # set-based enqueue (measured: 54k → 141k rows/s without them). Jobs are only created
    # from an existing broadcast by workers.queue, and campaigns with jobs are
    # never deleted.
    Column("broadcast_id", BigInteger),
    Column("campaign_id", BigInteger),
    Column("subscriber_id", BigInteger),
    # The SaaS's own user id, for verification mail.
    Column("user_ref", Text),
    Column("idempotency_key", Text),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("flags", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("last_error", Text),
    Column("last_error_class", Text),
    Column("requested_by", Text),
    created_at(),
    Column("finished_at", DateTime(timezone=True)),
    Column("dismissed_at", DateTime(timezone=True)),
    # The end of the message's dedupe window (its kind's, from created_at); NULL: none.
    Column("dedupe_until", DateTime(timezone=True)),
    # The end of the cooldown this message opened for its address (created_at plus the
    # cooldown it was asked with: verification, resends); NULL: none.
    Column("cooldown_until", DateTime(timezone=True)),
    CheckConstraint(check_in("status", JOB_STATUSES), name="delivery_jobs_status_check"),
    # The engine's own kinds and the admins' (rows of `kinds`, no foreign key: it would
    # cost the set-based broadcast enqueue a lookup per row).
    CheckConstraint(states.KIND_CHECK, name="delivery_jobs_kind_check"),
    # One message per user, kind and dedupe window (docs/design.md §21), under any concurrency: no
    # two not-cancelled messages of one (kind, user) have overlapping windows.
    ExcludeConstraint(("user_ref", "="), ("kind", "="),
                      (text("tstzrange(created_at, dedupe_until)"), "&&"),
                      name="delivery_jobs_dedupe_excl", using="gist",
                      where=text(f"dedupe_until IS NOT NULL AND status <> '{states.CANCELLED}'")),
    # No second email of a kind to one address inside the cooldown (docs/design.md §21),
    # whoever asks and under any concurrency: no two not-cancelled messages of one (address,
    # kind) have overlapping cooldowns; the pair is compared as a 64-bit hash of both, a
    # cheaper check (migration 0049).
    ExcludeConstraint((text("hashtextextended(kind || ' ' || lower(email), 0)"), "="),
                      (text("tstzrange(created_at, cooldown_until)"), "&&"),
                      name="delivery_jobs_cooldown_excl", using="gist",
                      where=text(f"cooldown_until IS NOT NULL AND status <> '{states.CANCELLED}'")),
    # The claim: transactional jobs by priority (P7), then due time; each open broadcast's
    # due jobs from its own range, so a paused campaign's backlog is never read.
    Index("delivery_jobs_claim_idx", "priority", "available_at", "id",
          postgresql_where=text(f"status IN {sql_list(states.CLAIMABLE)} "
                                "AND broadcast_id IS NULL")),
    Index("delivery_jobs_broadcast_due_idx", "broadcast_id", "available_at", "id",
          postgresql_where=text(f"status IN {sql_list(states.CLAIMABLE)}")),
    # The jobs browser's Retrying tab, in the order they come due (retries are few: the
    # index holds only them, whatever the size of the campaigns around them).
    Index("delivery_jobs_retry_idx", "priority", "available_at", "id",
          postgresql_where=text(f"status = '{states.RETRY}'")),
    # Taking back jobs from dead workers scans only the in-flight ones.
    Index("delivery_jobs_sending_idx", "claimed_by",
          postgresql_where=text(f"status = '{states.SENDING}'")),
    # A campaign's problem jobs (its page's most frequent errors). Only those: an entry on
    # every job cost each enqueued, settled and sent campaign job and each transactional
    # job one more index write; its counts come from broadcast_counts.
    Index("delivery_jobs_broadcast_idx", "broadcast_id", "status",
          postgresql_where=text(f"broadcast_id IS NOT NULL AND status IN "
                                f"{sql_list((states.RETRY, *states.PROBLEM))}")),
    # The failed-jobs inbox: newest first with keyset paging on (finished_at, id), all
    # problems or one campaign's.
    Index("delivery_jobs_problem_idx", "finished_at", "id",
          postgresql_where=text(f"status IN {sql_list(states.PROBLEM)} AND dismissed_at IS NULL")),
    Index("delivery_jobs_problem_campaign_idx", "campaign_id", "finished_at", "id",
          postgresql_where=text(f"status IN {sql_list(states.PROBLEM)} AND dismissed_at IS NULL")),
    # Queue health and /metrics count the (few) non-campaign jobs per state from this;
    # campaign jobs are counted by broadcast_counts.
    Index("delivery_jobs_transactional_idx", "kind", "status",
          postgresql_where=text("kind <> 'broadcast'")),
    # Support finds users by any part of an address or user id (pg_trgm).
    Index("delivery_jobs_transactional_search_idx",
          literal_column("lower((email || ' '::text) || COALESCE(user_ref, ''::text))")
          .label("search"), postgresql_using="gin",
          postgresql_ops={"search": "gin_trgm_ops"},
          postgresql_where=text("kind <> 'broadcast'")),
    # The address filter's index: transactional jobs and a campaign's retrying, failed and
    # bounced ones (never its millions waiting or sent).
    Index("delivery_jobs_email_idx", text("lower(email)"),
          postgresql_where=text(f"kind <> 'broadcast' OR status IN "
                                f"{sql_list(states.ADDRESS_INDEXED)}")),
    Index("delivery_jobs_correlation_idx", "correlation_id",
          postgresql_where=text(f"kind <> 'broadcast' OR status IN {sql_list(states.PROBLEM)}")),
    Index("delivery_jobs_user_idx", "user_ref", "created_at",
          postgresql_where=text("user_ref IS NOT NULL")),
    # One live verification job per user (docs/design.md §21: asking again returns it). Other kinds
    # dedupe by their window (delivery_jobs_dedupe_excl).
    Index("delivery_jobs_one_active_idx", "kind", "user_ref", unique=True,
          postgresql_where=text(
              "kind = 'verification' AND user_ref IS NOT NULL AND status IN "
              f"{sql_list(states.ACTIVE)}")),
    # The Transactional page: one kind's jobs requested in the last 24 hours.
    Index("delivery_jobs_kind_created_idx", "kind", "created_at",
          postgresql_where=text("kind <> 'broadcast'")),
    Index("delivery_jobs_idempotency_idx", "kind", "idempotency_key", unique=True,
          postgresql_where=text("idempotency_key IS NOT NULL")),
    # Sent per minute, and the jobs browser's Sent and Cancelled tabs (newest first).
    Index("delivery_jobs_sent_idx", "finished_at", "id",
          postgresql_where=text(f"status = '{states.SENT}'")),
    Index("delivery_jobs_cancelled_idx", "finished_at", "id",
          postgresql_where=text(f"status = '{states.CANCELLED}'")),
    # A campaign's sending rate: jobs finished in the last minute, read from the newest end.
    # Retention walks it too, with a keyset on (finished_at, id): the id is in the key
    # because a cancel settles thousands of jobs with one finished_at.
    Index("delivery_jobs_broadcast_finished_idx", "broadcast_id", "finished_at", "id",
          postgresql_where=text("broadcast_id IS NOT NULL AND finished_at IS NOT NULL")),
)

job_attempts = Table(
    "job_attempts", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("job_id", BigInteger, ForeignKey("delivery_jobs.id", ondelete="CASCADE"),
           nullable=False),
    Column("attempt", SmallInteger, nullable=False),
    # The job's kind, so the per-kind stats never join the jobs (NULL only in rows written
    # by hand; readers fall back to the job's).
    Column("kind", Text),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("duration_ms", Float, nullable=False, server_default=text("0")),
    Column("outcome", Text, nullable=False),
    Column("smtp_code", SmallInteger),
    Column("enhanced_code", Text),
    Column("reply", Text),
    Column("stage", Text),
    Column("worker", Text),
    Index("job_attempts_job_idx", "job_id", "attempt"),
    Index("job_attempts_started_idx", "started_at"),
)

# Exact per-broadcast counts without counting a million rows: a statement-level trigger on
# delivery_jobs adds each statement's deltas to one of a few slots, in the same transaction
# as the change itself, so the sum over slots equals GROUP BY status at every snapshot (P8).
broadcast_counts = Table(
    "broadcast_counts", metadata,
    Column("broadcast_id", BigInteger, ForeignKey("broadcasts.id", ondelete="CASCADE"),
           nullable=False),
    Column("status", Text, nullable=False),
    Column("slot", SmallInteger, nullable=False),
    Column("n", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("broadcast_id", "status", "slot"),
    postgresql_with={"fillfactor": "50"},
)

# The same for the jobs of no broadcast (verification, test, …), per kind: the stats read
# a few counter rows, never every transactional job ever sent (migration 0012).
kind_counts = Table(
    "kind_counts", metadata,
    Column("kind", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("slot", SmallInteger, nullable=False),
    Column("n", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("kind", "status", "slot"),
    postgresql_with={"fillfactor": "50"},
)

suppressions = Table(
    "suppressions", metadata,
    Column("email", Text, primary_key=True),  # always lower-cased
    Column("reason", Text, nullable=False),
    Column("job_id", BigInteger, ForeignKey("delivery_jobs.id", ondelete="SET NULL")),
    Column("reply", Text),
    Column("note", Text, nullable=False, server_default=""),
    Column("created_by", Text),
    created_at(),
    Column("reason_code", Text),  # a bounce's reason (userunknown, …) when one suppressed
    CheckConstraint(check_in("reason", SUPPRESSION_REASONS), name="suppressions_reason_check"),
    CheckConstraint("email = lower(email)", name="suppressions_email_lower_check"),
    # The suppression page pages by keyset (newest first, email breaks ties), optionally
    # per reason, and searches by the start of the address (byte order, any collation).
    Index("suppressions_reason_idx", "reason", "created_at", "email"),
    Index("suppressions_created_idx", "created_at", "email"),
    # Deleting or archiving jobs sets job_id to NULL here (ON DELETE SET NULL): without
    # this index every deleted job would scan the suppression list.
    Index("suppressions_job_idx", "job_id", postgresql_where=text("job_id IS NOT NULL")),
    Index("suppressions_email_prefix_idx", "email",
          postgresql_ops={"email": "text_pattern_ops"}),
    # Search by any part of the address: a domain ("@example.net") or a fragment.
    Index("suppressions_email_trgm_idx", "email", postgresql_using="gin",
          postgresql_ops={"email": "gin_trgm_ops"}),
)

# Liveness is in the schema: each pool holds a lease (docs/design.md §15), an expiry on the database
# clock that its heartbeat renews. A worker whose lease expired more than
# SENDDOCK_LEASE_GRACE ago is dead: peers take its jobs back. Its own node's next start
# takes them back at once when the old process is gone from this host. Never judged by a
# session or an advisory lock (a vanished host keeps its session for hours).
workers = Table(
    "workers", metadata,
    Column("id", Text, primary_key=True),
    Column("node", Text, nullable=False),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("threads", Integer, nullable=False),
    Column("in_flight", Integer, nullable=False, server_default=text("0")),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The lease: valid until then (database clock); the term grows each time it lapsed
    # before its renewal (claims of an older term are void for the worker).
    Column("lease_until", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("lease_term", Integer, nullable=False, server_default=text("0")),
    Column("stopped_at", DateTime(timezone=True)),
    Index("workers_node_idx", "node"),
)

# One row per relay of SENDDOCK_SMTP_URL (id = its place in the list, 1 for a single
# relay): its health as every process sees it (P6, docs/design.md §17).
relay_state = Table(
    "relay_state", metadata,
    Column("id", SmallInteger, primary_key=True),
    Column("status", Text, nullable=False, server_default="ok"),
    Column("since", DateTime(timezone=True)),
    Column("last_error", Text),
    Column("failures", Integer, nullable=False, server_default=text("0")),
    Column("next_probe_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # 'login' when the relay refused our credentials (probed at most every 5 minutes).
    Column("reason", Text),
    # Which SMTP URL was refused (a hash, never the password): a process started with a
    # different one probes at once instead of inheriting the backoff.
    Column("smtp_fingerprint", Text),
    # A recipient whose RCPT got the refusal: the probe asks RCPT for it too, since Postfix
    # reports client, HELO and relaying refusals only at RCPT.
    Column("probe_recipient", Text),
    # The relay is throttling us: nothing is claimed until then (no attempt is used).
    Column("throttled_until", DateTime(timezone=True)),
    Column("throttle_reply", Text),
    Column("throttle_hits", Integer, nullable=False, server_default=text("0")),
    # Pauses in a row of a relay that closes the channel (421): the backoff step in force.
    Column("pause_hits", Integer, nullable=False, server_default=text("0")),
    CheckConstraint("status IN ('ok', 'down')", name="relay_state_status_check"),
)

# A recipient domain that throttles us (Gmail 4.7.28, Outlook 4.7.650...): its jobs wait
# until `until`; other domains keep flowing.
domain_throttles = Table(
    "domain_throttles", metadata,
    Column("domain", Text, primary_key=True),
    Column("until", DateTime(timezone=True), nullable=False),
    Column("last_reply", Text),
    Column("hits", Integer, nullable=False, server_default=text("1")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Cross-process rate limit on the database clock (one row, id = 1): `tat` is the
# theoretical arrival time of the next permitted send (GCRA), so SENDDOCK_RATE_LIMIT may be
# fractional and holds across processes and hosts.
rate_limiter = Table(
    "rate_limiter", metadata,
    Column("id", SmallInteger, primary_key=True),
    Column("tat", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # A relay that throttles us paces every process (docs/design.md §17, AIMD): the send rate in
    # force (NULL: not paced), the additive step it grows back by, and when it last changed.
    Column("paced_rate", Float),
    Column("paced_step", Float),
    Column("paced_at", DateTime(timezone=True)),
    CheckConstraint("id = 1", name="rate_limiter_single_row"),
)

# A From address the relay refuses (docs/design.md §17): probed with the same MAIL FROM on a
# backoff; the campaigns it paused resume by themselves once the relay accepts it.
sender_refusals = Table(
    "sender_refusals", metadata,
    Column("sender", Text, primary_key=True),
    Column("since", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_reply", Text),
    Column("failures", Integer, nullable=False, server_default=text("1")),
    Column("next_probe_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("probe_recipient", Text),
)

# Sends started per minute (database clock): SENDDOCK_RATE_LIMIT_HOUR/_DAY over rolling
# windows, and what Queue health shows as used.
rate_minutes = Table(
    "rate_minutes", metadata,
    Column("minute", DateTime(timezone=True), primary_key=True),
    Column("used", Integer, nullable=False),
)

# Counted attempts per minute, kind and outcome class (migration 0035_minute_counters),
# kept by a statement trigger on job_attempts in slot pg_backend_pid() % 8: Queue health's
# chart and failure rate sum a few rows per minute. Pruned past queue.MINUTES_KEPT.
attempt_minutes = Table(
    "attempt_minutes", metadata,
    Column("minute", DateTime(timezone=True), nullable=False),
    Column("kind", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("slot", SmallInteger, nullable=False),
    Column("n", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("minute", "kind", "outcome", "slot"),
    postgresql_with={"fillfactor": "50"},
)
