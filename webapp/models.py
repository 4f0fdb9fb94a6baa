"""The schema, as SQLAlchemy Core tables. Alembic's migrations must produce exactly this
(``tests/integration/test_migrations.py`` compares them). The engine's own tables (the jobs,
attempts, suppressions, workers, relays, pacing) are defined in :mod:`workers.core.tables`
and re-exported here, on the same metadata.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from workers.after_acceptance import event_queue
from workers.core import states
from workers.core.states import sql_list

# The engine's tables are defined in the engine (workers/core/tables.py) on the one
# metadata every table shares; imported here so the web app and Alembic see them all.
from workers.core.tables import JOB_STATUSES as JOB_STATUSES
from workers.core.tables import SUPPRESSION_REASONS as SUPPRESSION_REASONS
from workers.core.tables import attempt_minutes as attempt_minutes
from workers.core.tables import broadcast_counts as broadcast_counts
from workers.core.tables import check_in as _in
from workers.core.tables import created_at as _now
from workers.core.tables import delivery_jobs as delivery_jobs
from workers.core.tables import domain_throttles as domain_throttles
from workers.core.tables import job_attempts as job_attempts
from workers.core.tables import kind_counts as kind_counts
from workers.core.tables import metadata as metadata
from workers.core.tables import rate_limiter as rate_limiter
from workers.core.tables import rate_minutes as rate_minutes
from workers.core.tables import relay_state as relay_state
from workers.core.tables import sender_refusals as sender_refusals
from workers.core.tables import suppressions as suppressions
from workers.core.tables import workers as workers

JOB_KINDS = states.KINDS
ROLES = ("admin", "marketer", "support")
CAMPAIGN_STATUSES = states.Campaign.STATES


users = Table(
    "users", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("email", Text, nullable=False),
    Column("password_hash", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("active", Boolean, nullable=False, server_default=text("true")),
    # Bumped on password change or disable: sessions carry it and die when it moves.
    Column("session_version", Integer, nullable=False, server_default=text("1")),
    Column("failed_logins", Integer, nullable=False, server_default=text("0")),
    Column("locked_until", DateTime(timezone=True)),
    Column("last_login_at", DateTime(timezone=True)),
    # The UI language the user chose (None: the browser's Accept-Language decides).
    Column("locale", Text),
    _now(),
    CheckConstraint(_in("role", ROLES), name="users_role_check"),
    # Two-factor (TOTP): the secret sealed with the secret key, since when, and the last
    # accepted time step (a code is refused on replay).
    Column("totp_secret", Text),
    Column("totp_enabled_at", DateTime(timezone=True)),
    Column("totp_last_step", BigInteger),
    Index("users_email_key", text("lower(email)"), unique=True),
)

# One row per login (the cookie holds the random id, the row its SHA-256): a session ends
# when its row goes (logout, password change, disable), whoever holds a copy of the cookie.
web_sessions = Table(
    "web_sessions", metadata,
    Column("id", Text, primary_key=True),
    Column("user_id", BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    _now(),
    Index("web_sessions_user_idx", "user_id"),
    # When this session last passed the second factor (step-up before sensitive actions).
    Column("second_factor_at", DateTime(timezone=True)),
    # Who sees it on "Your sessions": the browser, the address last seen from, and when.
    Column("user_agent", Text, nullable=False, server_default=text("''")),
    Column("address", Text, nullable=False, server_default=text("''")),
    Column("last_seen_at", DateTime(timezone=True), nullable=False,
           server_default=text("now()")),
)

# Single-use two-factor recovery codes (SHA-256 of each; used_at once spent).
recovery_codes = Table(
    "recovery_codes", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("user_id", BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("code_hash", Text, nullable=False),
    Column("used_at", DateTime(timezone=True)),
    _now(),
    Index("recovery_codes_user_idx", "user_id"),
)

# Addresses erased on request (GDPR art. 17), as SHA-256 of the lower-cased address: an
# insert of one again (subscriber or job) puts it back on the suppression list (triggers
# of migration 0040).
erased_addresses = Table(
    "erased_addresses", metadata,
    Column("email_hash", Text, primary_key=True),
    Column("reason", Text, nullable=False),
    Column("erased_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Roles whose users must enrol in two-factor (sent to enrolment at login).
second_factor_roles = Table(
    "second_factor_roles", metadata,
    Column("role", Text, primary_key=True),
    _now(),
)

api_tokens = Table(
    "api_tokens", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("user_id", BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False, server_default=""),
    Column("prefix", Text, nullable=False),
    Column("token_hash", Text, nullable=False, unique=True),
    Column("last_used_at", DateTime(timezone=True)),
    Column("revoked_at", DateTime(timezone=True)),
    # After this the token answers 401 (None: it never expires).
    Column("expires_at", DateTime(timezone=True)),
    _now(),
    # The kind of mail submitted by SMTP with this token when no X-SendDock-Kind says.
    Column("default_kind", Text),
    # What the token may do (webapp.access.SCOPES), within its owner's role; and the
    # client address of its last use.
    Column("scopes", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("last_used_addr", Text),
)

login_attempts = Table(
    "login_attempts", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("email", Text, nullable=False),
    Column("remote_addr", Text, nullable=False),
    Column("succeeded", Boolean, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("login_attempts_addr_idx", "remote_addr", "at"),
)

lists = Table(
    "lists", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    # Kept exact by statement-level triggers on memberships (migration 0001), so list pages
    # never count a million memberships.
    Column("subscriber_count", BigInteger, nullable=False, server_default=text("0")),
    _now(),
)

# A list's public subscription form (migration 0027_marketers): off until a marketer turns
# it on; its title, intro and accent colour are the marketer's.
list_forms = Table(
    "list_forms", metadata,
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="CASCADE"),
           primary_key=True),
    Column("enabled", Boolean, nullable=False, server_default=text("false")),
    Column("title", Text, nullable=False, server_default=""),
    Column("intro", Text, nullable=False, server_default=""),
    Column("accent", Text, nullable=False, server_default="#2b6cb0"),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("accent ~ '^#[0-9a-fA-F]{6}$'", name="list_forms_accent_check"),
)

# A saved audience: the list narrowed by conditions (a JSON array the engine compiles to a
# parameterised predicate, workers.queue.audience). Migration 0029_segments.
segments = Table(
    "segments", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
    Column("name", Text, nullable=False),
    Column("conditions", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("created_by", BigInteger, ForeignKey("users.id", ondelete="SET NULL")),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("segments_list_name_key", "list_id", literal_column("lower(name)"), unique=True),
)

# Reusable HTML around a campaign's body: must hold {{ content }} and {{ unsubscribe_url }}
# ({{ postal_address }} is filled from its own field). Migration 0029_segments.
layouts = Table(
    "layouts", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("name", Text, nullable=False),
    Column("html", Text, nullable=False),
    Column("postal_address", Text, nullable=False, server_default=""),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("layouts_name_key", literal_column("lower(name)"), unique=True),
)

# Every double opt-in request (form or public API): the consent kept. Pending (confirmed_at
# NULL) is not a membership, so no campaign reaches it; confirming adds the membership.
subscription_requests = Table(
    "subscription_requests", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
    Column("email", Text, nullable=False),
    Column("name", Text, nullable=False, server_default=""),
    Column("source", Text, nullable=False),
    Column("locale", Text, nullable=False, server_default="en"),
    Column("remote_addr", Text, nullable=False),
    Column("requested_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("confirmed_at", DateTime(timezone=True)),
    Column("confirmed_addr", Text),
    CheckConstraint("source IN ('form', 'api')", name="subscription_requests_source_check"),
    Index("subscription_requests_addr_idx", "remote_addr", "requested_at"),
    Index("subscription_requests_list_email_idx", "list_id", literal_column("lower(email)")),
)

# A CSV file checked first (dry run, column mapping), kept in the database so that any web
# process can import it; a row past expires_at is gone (deleted when the next file is kept
# or asked for). The file itself is in chunks of a MiB. Migration 0020.
import_uploads = Table(
    "import_uploads", metadata,
    Column("token", Text, primary_key=True),
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
    Column("filename", Text, nullable=False),
    Column("size", BigInteger, nullable=False, server_default=text("0")),
    _now(),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    # Who checked the file (migration 0047_import_check): one kept file per user and list.
    Column("owner_id", BigInteger, ForeignKey("users.id", ondelete="CASCADE"),
           nullable=False),
    Index("import_uploads_expires_idx", "expires_at"),
    Index("import_uploads_owner_list_key", "owner_id", "list_id", unique=True),
)

import_upload_chunks = Table(
    "import_upload_chunks", metadata,
    Column("token", Text, ForeignKey("import_uploads.token", ondelete="CASCADE"),
           nullable=False),
    Column("seq", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("token", "seq"),
)

subscribers = Table(
    "subscribers", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("email", Text, nullable=False),
    Column("name", Text, nullable=False, server_default=""),
    Column("attributes", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("status", Text, nullable=False, server_default="active"),
    _now(),
    Column("locale", Text),  # chosen on the preference page (migration 0042_preferences)
    # Consent to open and click tracking (migration 0045_tracking_consent).
    Column("tracking", Boolean, nullable=False, server_default=text("true")),
    CheckConstraint("status IN ('active', 'unsubscribed', 'blocklisted')",
                    name="subscribers_status_check"),
    # One subscriber per address however it is cased.
    Index("subscribers_email_key", text("lower(email)"), unique=True),
    # Search by any part of the address or name (pg_trgm), fast at millions of subscribers.
    Index("subscribers_search_idx",
          literal_column("lower((email || ' '::text) || name)").label("search"),
          postgresql_using="gin", postgresql_ops={"search": "gin_trgm_ops"}),
)

memberships = Table(
    "memberships", metadata,
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
    Column("subscriber_id", BigInteger, ForeignKey("subscribers.id", ondelete="CASCADE"),
           nullable=False),
    _now(),
    PrimaryKeyConstraint("list_id", "subscriber_id"),
    Index("memberships_subscriber_idx", "subscriber_id"),
)

# Who left which list (preference page, unsubscribe link, one-click): the membership is
# deleted and only a new confirmed consent (double opt-in) adds it back (0042_preferences).
list_unsubscribes = Table(
    "list_unsubscribes", metadata,
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
    Column("subscriber_id", BigInteger, ForeignKey("subscribers.id", ondelete="CASCADE"),
           nullable=False),
    Column("campaign_id", BigInteger),
    Column("via", Text, nullable=False),
    _now(),
    PrimaryKeyConstraint("list_id", "subscriber_id"),
    Index("list_unsubscribes_subscriber_idx", "subscriber_id"),
)

campaigns = Table(
    "campaigns", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("name", Text, nullable=False),
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="RESTRICT"), nullable=False),
    Column("from_addr", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("text_body", Text),
    Column("html_body", Text),
    Column("status", Text, nullable=False, server_default=states.Campaign.DRAFT),
    Column("scheduled_at", DateTime(timezone=True)),
    Column("broadcast_id", BigInteger, ForeignKey("broadcasts.id", use_alter=True,
                                                   name="campaigns_broadcast_id_fkey")),
    Column("created_by", BigInteger, ForeignKey("users.id", ondelete="SET NULL")),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    # Why the system paused it (complaint rate, docs/design.md §18); cleared when it is resumed.
    Column("paused_reason", Text),
    # Its audience narrowed to a saved segment of its list, and the layout around its HTML
    # (migration 0029_segments). A sent campaign keeps its segment's conditions on the
    # broadcast, so deleting the segment only forgets which one it was.
    Column("segment_id", BigInteger, ForeignKey("segments.id", ondelete="SET NULL",
                                                name="campaigns_segment_id_fkey")),
    Column("layout_id", BigInteger, ForeignKey("layouts.id", ondelete="RESTRICT",
                                               name="campaigns_layout_id_fkey")),
    CheckConstraint(_in("status", CAMPAIGN_STATUSES), name="campaigns_status_check"),
    Index("campaigns_scheduled_idx", "scheduled_at",
          postgresql_where=text(f"status = '{states.Campaign.SCHEDULED}'")),
)

broadcasts = Table(
    "broadcasts", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("campaign_id", BigInteger, ForeignKey("campaigns.id", ondelete="CASCADE"),
           nullable=False),
    # Audience summary fixed at send time: who was enqueued and who was left out, and why.
    Column("total", Integer, nullable=False, server_default=text("0")),
    Column("skipped_suppressed", Integer, nullable=False, server_default=text("0")),
    Column("skipped_inactive", Integer, nullable=False, server_default=text("0")),
    # Set when the jobs exist. The send request only records the broadcast (durably) and
    # returns; a worker enqueues the audience in one set-based statement (docs/design.md §20).
    Column("enqueued_at", DateTime(timezone=True)),
    # The enqueue goes through the list in subscriber order, a chunk per transaction: the
    # last subscriber id done (workers.queue.enqueue_chunk).
    Column("enqueued_upto", BigInteger, nullable=False, server_default=text("0")),
    _now(),
    Column("finished_at", DateTime(timezone=True)),
    # Jobs of this broadcast with at least one complaint (docs/design.md §18's complaint rate).
    Column("complaints", Integer, nullable=False, server_default=text("0")),
    # When retention rolled it up (docs/design.md §26): its counters stay exact, its failed and
    # bounced jobs (and any job with a feedback event) stay, the rest of its rows are gone.
    Column("rolled_up_at", DateTime(timezone=True)),
    # The segment's conditions frozen at send time (NULL: the whole list); the enqueue
    # compiles them with workers.queue.audience (migration 0029_segments).
    Column("audience_filter", JSONB),
    # The ids between which its jobs lie (the enqueue inserts them together; transactional
    # jobs inserted meanwhile may sit in between): a cancel's settler walks this span along
    # the primary key (migration 0032_scale3).
    Column("first_job_id", BigInteger),
    Column("last_job_id", BigInteger),
)

# Analytics and the public archive (migration 0030_tracking):
# per campaign, off unless a marketer turns them on (no row: all off).
campaign_tracking = Table(
    "campaign_tracking", metadata,
    Column("campaign_id", BigInteger, ForeignKey("campaigns.id", ondelete="CASCADE"),
           primary_key=True),
    Column("track_opens", Boolean, nullable=False, server_default=text("false")),
    Column("track_clicks", Boolean, nullable=False, server_default=text("false")),
    Column("archive", Boolean, nullable=False, server_default=text("false")),
)

# A tracked campaign's links, each once: a click's redirect goes to the URL stored here.
campaign_links = Table(
    "campaign_links", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("campaign_id", BigInteger, ForeignKey("campaigns.id", ondelete="CASCADE"),
           nullable=False),
    Column("url", Text, nullable=False),
    UniqueConstraint("campaign_id", "url", name="campaign_links_campaign_url_key"),
)

# One row per open or click (no IP address, no user agent). job_id has no foreign key:
# retention rolls finished jobs up, the events stay.
campaign_events = Table(
    "campaign_events", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("campaign_id", BigInteger, ForeignKey("campaigns.id", ondelete="CASCADE"),
           nullable=False),
    Column("broadcast_id", BigInteger),
    Column("job_id", BigInteger, nullable=False),
    Column("subscriber_id", BigInteger, ForeignKey("subscribers.id", ondelete="CASCADE"),
           nullable=False),
    Column("kind", Text, nullable=False),
    Column("link_id", BigInteger, ForeignKey("campaign_links.id", ondelete="CASCADE")),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("kind IN ('open', 'click')", name="campaign_events_kind_check"),
    CheckConstraint("(kind = 'click') = (link_id IS NOT NULL)",
                    name="campaign_events_link_check"),
    Index("campaign_events_subscriber_idx", "subscriber_id", "kind", "at"),
    Index("campaign_events_campaign_idx", "campaign_id", "kind", "at"),
    Index("campaign_events_link_idx", "link_id"),
)

audit_log = Table(
    "audit_log", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False, server_default=""),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Index("audit_log_at_idx", "at"),
    Index("audit_log_action_idx", "action", "at"),
    Index("audit_log_target_idx", "target", "id"),
)

# Transactional kinds (docs/design.md §21): the built-in `verification` and the admins' own kinds.
# A kind's class fixes the priority of its jobs at enqueue (workers.building.kinds.CLASS_PRIORITY).
# NULL retry_schedule / resend_cooldown: the settings' defaults (the built-in kind only).
kinds = Table(
    "kinds", metadata,
    Column("name", Text, primary_key=True),
    Column("class", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("subject", Text, nullable=False),
    Column("text_body", Text),
    Column("html_body", Text),
    Column("retry_schedule", ARRAY(Integer)),
    Column("resend_cooldown", Integer),
    Column("dedupe_window", Integer, nullable=False, server_default=text("0")),
    Column("active", Boolean, nullable=False, server_default=text("true")),
    Column("builtin", Boolean, nullable=False, server_default=text("false")),
    # Bumped by every edit; jobs carry the version they were enqueued with, so a worker
    # never renders them with an older template.
    Column("version", Integer, nullable=False, server_default=text("1")),
    Column("sample_data", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("sample_event", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("updated_by", Text),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(f"name ~ '{states.KIND_NAME}'", name="kinds_name_check"),
    CheckConstraint("class IN ('critical', 'lifecycle')", name="kinds_class_check"),
    CheckConstraint("text_body IS NOT NULL OR html_body IS NOT NULL", name="kinds_body_check"),
    CheckConstraint("dedupe_window >= 0", name="kinds_dedupe_window_check"),
)

# Cumulative outcome counters for /metrics, kept by a statement-level trigger on
# delivery_jobs status changes (migration 0014), slotted like broadcast_counts.
job_outcome_counts = Table(
    "job_outcome_counts", metadata,
    Column("kind", Text, nullable=False),
    Column("class", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("slot", SmallInteger, nullable=False),
    Column("n", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("kind", "class", "outcome", "slot"),
    postgresql_with={"fillfactor": "50"},
)

# The cumulative time-to-sent histogram: jobs per bucket of TIME_TO_SENT_BOUNDS and their
# summed seconds, kept by the same trigger.
time_to_sent_counts = Table(
    "time_to_sent_counts", metadata,
    Column("kind", Text, nullable=False),
    Column("class", Text, nullable=False),
    Column("bucket", SmallInteger, nullable=False),
    Column("slot", SmallInteger, nullable=False),
    Column("n", BigInteger, nullable=False, server_default=text("0")),
    Column("seconds", Float, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("kind", "class", "bucket", "slot"),
    postgresql_with={"fillfactor": "50"},
)


# --- after acceptance (docs/design.md §18) --------------------------------------------------------

FEEDBACK_SOURCES = ("mailbox", "ses", "sendgrid", "postmark", "mailgun", "generic")
FEEDBACK_TYPES = ("bounce", "complaint")
EVENT_WEBHOOK_EVENTS = event_queue.EVENTS
DELIVERY_STATUSES = event_queue.DELIVERY_STATUSES

# An admin's correction of a bounce's reading, kept as a rule: a bounce whose reply text
# holds ``pattern`` (spaces collapsed, case ignored) gets ``reason`` (Sisimai's vocabulary),
# whatever the reader said; the longest pattern wins (docs/design.md §36).
bounce_rules = Table(
    "bounce_rules", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("pattern", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("note", Text, nullable=False, server_default=""),
    Column("created_by", Text, nullable=False, server_default=""),
    Column("from_event_id", BigInteger),
    Column("hits", BigInteger, nullable=False, server_default=text("0")),
    Column("last_hit_at", DateTime(timezone=True)),
    _now(),
    Index("bounce_rules_pattern_key", text("lower(pattern)"), unique=True),
    CheckConstraint("char_length(pattern) BETWEEN 3 AND 500",
                    name="bounce_rules_pattern_check"),
)

# Every bounce or complaint reported after acceptance, with its raw source, on its job
# (job_id is NULL for one no job matched). (source, event_id) is unique: a provider's event
# delivered twice is stored, and acted on, once.
job_events = Table(
    "job_events", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("job_id", BigInteger, ForeignKey("delivery_jobs.id", ondelete="CASCADE")),
    Column("source", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("bounce", Text),
    Column("email", Text, nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("status", Text),
    Column("event_id", Text),
    Column("message_id", Text),
    Column("effect", Text, nullable=False),
    Column("raw", Text, nullable=False, server_default=""),
    Column("reason_code", Text),  # the bounce's reason (after_acceptance/bounces/reasons.py)
    # The rule that decided the reason (bounce_rules), the reader's own reason when a rule
    # or an admin's correction changed it, and when an admin corrected it.
    Column("rule_id", BigInteger, ForeignKey("bounce_rules.id", ondelete="SET NULL")),
    Column("read_as", Text),
    Column("corrected_at", DateTime(timezone=True)),
    _now(),
    CheckConstraint(_in("source", FEEDBACK_SOURCES), name="job_events_source_check"),
    CheckConstraint(_in("type", FEEDBACK_TYPES), name="job_events_type_check"),
    # 'sender': a bounce about us (blocklist, reputation, rate): counts against nobody.
    CheckConstraint("bounce IS NULL OR bounce IN ('hard', 'soft', 'sender')",
                    name="job_events_bounce_check"),
    Index("job_events_job_idx", "job_id", "created_at"),
    Index("job_events_email_idx", text("lower(email)"), "created_at"),
    Index("job_events_created_idx", "created_at"),
    Index("job_events_event_key", "source", "event_id", unique=True,
          postgresql_where=text("event_id IS NOT NULL")),
)

# Bounce-mailbox mail the reader could not understand: moved to the mailbox's "could not
# read" folder and listed on Queue health with the reason.
mailbox_unreadable = Table(
    "mailbox_unreadable", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("digest", Text, nullable=False, unique=True),
    Column("subject", Text, nullable=False, server_default=""),
    Column("sender", Text, nullable=False, server_default=""),
    Column("error", Text, nullable=False),
    Column("folder", Text, nullable=False, server_default=""),
    Column("raw", Text, nullable=False, server_default=""),  # the first 256 KiB
    _now(),
    Index("mailbox_unreadable_created_idx", "created_at"),
)

# Requests and mails already processed: a replayed signed webhook (same SNS MessageId,
# SendGrid signature, Mailgun token) or a bounce-mailbox message seen again (same digest)
# is recognised and changes nothing.
feedback_receipts = Table(
    "feedback_receipts", metadata,
    Column("source", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("source", "key"),
    Index("feedback_receipts_received_idx", "received_at"),
)

# Bearer tokens for /webhooks/generic (``senddock webhook-token create``), stored hashed.
webhook_tokens = Table(
    "webhook_tokens", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("name", Text, nullable=False, server_default=""),
    Column("prefix", Text, nullable=False),
    Column("token_hash", Text, nullable=False, unique=True),
    Column("last_used_at", DateTime(timezone=True)),
    Column("revoked_at", DateTime(timezone=True)),
    _now(),
)

# Outgoing event webhooks: endpoints admins configure. ``enabled`` is the admin's switch;
# ``disabled_at`` is set by the deliverer when the endpoint has failed continuously since
# ``failing_since`` for the configured time (an alarm), and its waiting deliveries are kept
# until it is enabled again.
webhook_endpoints = Table(
    "webhook_endpoints", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("url", Text, nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("events", ARRAY(Text), nullable=False),
    Column("kinds", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("secret", Text, nullable=False),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("disabled_at", DateTime(timezone=True)),
    Column("disabled_reason", Text),
    Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
    Column("failing_since", DateTime(timezone=True)),
    Column("last_attempt_at", DateTime(timezone=True)),
    Column("last_success_at", DateTime(timezone=True)),
    Column("last_status", SmallInteger),
    Column("last_response", Text),
    _now(),
)

# The durable queue of outgoing events: one row per (event, endpoint), queued by triggers
# in the transaction that made the change, claimed with SKIP LOCKED
# (workers.after_acceptance.event_queue). The row is the delivery log too: attempts, last
# status and response.
webhook_deliveries = Table(
    "webhook_deliveries", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("endpoint_id", BigInteger, ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
           nullable=False),
    Column("event", Text, nullable=False),
    Column("msg_id", Text, nullable=False,
           server_default=text("'msg_' || replace(gen_random_uuid()::text, '-', '')")),
    Column("payload", JSONB, nullable=False),
    Column("status", Text, nullable=False, server_default=event_queue.PENDING),
    Column("attempts", SmallInteger, nullable=False, server_default=text("0")),
    Column("available_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("claimed_by", Text),
    Column("claim_token", UUID(as_uuid=False)),
    Column("claimed_at", DateTime(timezone=True)),
    Column("last_status", SmallInteger),
    Column("last_response", Text),
    Column("last_error", Text),
    _now(),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint(_in("status", DELIVERY_STATUSES), name="webhook_deliveries_status_check"),
    Index("webhook_deliveries_claim_idx", "available_at", "id",
          postgresql_where=text(f"status IN {sql_list(event_queue.WAITING)}")),
    Index("webhook_deliveries_sending_idx", "claimed_at",
          postgresql_where=text(f"status = '{event_queue.SENDING}'")),
    Index("webhook_deliveries_endpoint_idx", "endpoint_id", "created_at"),
)

# DKIM (docs/design.md §19): the domains mail is sent From and their keys. The private key is stored
# only encrypted (workers/building/dkim.py: AES-GCM under a key derived from SENDDOCK_SECRET_KEY).
# Per domain and algorithm at most one active key (signs) and one next key (published,
# waiting to be activated): the two selectors of a rotation.
sending_domains = Table(
    "sending_domains", metadata,
    Column("domain", Text, primary_key=True),
    _now(),
)

dkim_keys = Table(
    "dkim_keys", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("domain", Text, ForeignKey("sending_domains.domain", ondelete="CASCADE"),
           nullable=False),
    Column("selector", Text, nullable=False),
    Column("algorithm", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("public_key", Text, nullable=False),
    Column("private_key_encrypted", Text, nullable=False),
    _now(),
    Column("activated_at", DateTime(timezone=True)),
    CheckConstraint("algorithm IN ('rsa', 'ed25519')", name="dkim_keys_algorithm_check"),
    CheckConstraint("status IN ('next', 'active', 'retired')", name="dkim_keys_status_check"),
    Index("dkim_keys_selector_idx", "domain", "selector", unique=True),
    Index("dkim_keys_one_active_idx", "domain", "algorithm", unique=True,
          postgresql_where=text("status = 'active'")),
    Index("dkim_keys_one_next_idx", "domain", "algorithm", unique=True,
          postgresql_where=text("status = 'next'")),
)

# SMTP submission (docs/smtp.md): each submitted message once, its jobs point at it.
smtp_messages = Table(
    "smtp_messages", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("token_id", BigInteger, ForeignKey("api_tokens.id", ondelete="SET NULL")),
    Column("message_id", Text, nullable=False, server_default=""),
    Column("mail_from", Text, nullable=False, server_default=""),
    Column("client", Text, nullable=False, server_default=""),
    Column("size", Integer, nullable=False),
    Column("raw", LargeBinary, nullable=False),
    _now(),
    Index("smtp_messages_created_idx", "created_at"),
)

# Failed SMTP AUTH per client address, shared by every submission process (lockout).
smtp_auth_failures = Table(
    "smtp_auth_failures", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("client", Text, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("smtp_auth_failures_client_idx", "client", "at"),
    Index("smtp_auth_failures_at_idx", "at"),
)

# Submission replies by outcome and code since the database was created (/metrics).
smtp_reply_counts = Table(
    "smtp_reply_counts", metadata,
    Column("outcome", Text, nullable=False),
    Column("code", Text, nullable=False),
    Column("n", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("outcome", "code"),
)

# Sequences (migration 0039_sequences; docs/sequences.md): welcome series and
# drips. An enrollment is one person's way through one sequence, at a step due at a time
# of the database's clock; the advancer (workers.delivery.sequences) reads the due ones
# from sequence_enrollments_due_idx and makes one job per (enrollment, email step).
sequences = Table(
    "sequences", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("name", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="active"),
    Column("trigger_type", Text, nullable=False),
    Column("list_id", BigInteger, ForeignKey("lists.id", ondelete="CASCADE")),
    Column("trigger_event", Text),
    Column("goal_event", Text),
    # NULL: once ever; N: again N days after the last entry.
    Column("reentry_days", Integer),
    Column("from_addr", Text),
    Column("layout_id", BigInteger, ForeignKey("layouts.id", ondelete="SET NULL")),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Opens and clicks of the sequence's messages: off unless turned on (as for campaigns).
    Column("track_opens", Boolean, nullable=False, server_default=text("false")),
    Column("track_clicks", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint(_in("status", states.Sequence.STATES), name="sequences_status_check"),
    CheckConstraint("trigger_type IN ('list_add', 'list_confirm', 'event')",
                    name="sequences_trigger_type_check"),
    CheckConstraint("(trigger_type = 'event') = (trigger_event IS NOT NULL) AND "
                    "(trigger_type = 'event') = (list_id IS NULL)",
                    name="sequences_trigger_check"),
    CheckConstraint("reentry_days IS NULL OR reentry_days >= 0", name="sequences_reentry_check"),
    Index("sequences_list_idx", "list_id", postgresql_where=text("list_id IS NOT NULL")),
    Index("sequences_event_idx", "trigger_event",
          postgresql_where=text("trigger_event IS NOT NULL")),
)

sequence_steps = Table(
    "sequence_steps", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("sequence_id", BigInteger, ForeignKey("sequences.id", ondelete="CASCADE"),
           nullable=False),
    Column("position", Integer, nullable=False),
    Column("type", Text, nullable=False),
    Column("subject", Text),
    Column("text_body", Text),
    Column("html_body", Text),
    Column("wait_seconds", Integer),
    Column("window_start", SmallInteger),
    Column("window_end", SmallInteger),
    Column("condition", JSONB),
    Column("if_false", Text),
    Column("skip", Integer, nullable=False, server_default=text("1")),
    Column("version", Integer, nullable=False, server_default=text("1")),
    Column("removed_at", DateTime(timezone=True)),
    CheckConstraint("type IN ('email', 'wait', 'condition')", name="sequence_steps_type_check"),
    CheckConstraint("type <> 'email' OR (subject IS NOT NULL AND "
                    "(text_body IS NOT NULL OR html_body IS NOT NULL))",
                    name="sequence_steps_email_check"),
    CheckConstraint("type <> 'wait' OR wait_seconds >= 0", name="sequence_steps_wait_check"),
    CheckConstraint("(window_start IS NULL) = (window_end IS NULL) AND "
                    "(window_start IS NULL OR (window_start BETWEEN 0 AND 23 AND "
                    "window_end BETWEEN 0 AND 24 AND window_start <> window_end))",
                    name="sequence_steps_window_check"),
    CheckConstraint("type <> 'condition' OR (condition IS NOT NULL AND "
                    "if_false IN ('skip', 'exit'))", name="sequence_steps_condition_check"),
    CheckConstraint("skip >= 1", name="sequence_steps_skip_check"),
    Index("sequence_steps_sequence_idx", "sequence_id", "position"),
)

sequence_enrollments = Table(
    "sequence_enrollments", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("sequence_id", BigInteger, ForeignKey("sequences.id", ondelete="CASCADE"),
           nullable=False),
    Column("subscriber_id", BigInteger, ForeignKey("subscribers.id", ondelete="CASCADE"),
           nullable=False),
    Column("status", Text, nullable=False, server_default="active"),
    Column("exit_reason", Text),
    Column("step_id", BigInteger),
    Column("due_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("data", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("entered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
    CheckConstraint(_in("status", states.Sequence.ENROLLMENT_STATES),
                    name="sequence_enrollments_status_check"),
    CheckConstraint("(status = 'exited') = (exit_reason IS NOT NULL)",
                    name="sequence_enrollments_exit_check"),
    Index("sequence_enrollments_due_idx", "due_at", "id",
          postgresql_where=text("status = 'active'")),
    Index("sequence_enrollments_open_idx", "sequence_id", "subscriber_id", unique=True,
          postgresql_where=text(f"status IN {sql_list(states.Sequence.OPEN)}")),
    Index("sequence_enrollments_subscriber_idx", "subscriber_id", "sequence_id", "entered_at"),
    Index("sequence_enrollments_step_idx", "step_id",
          postgresql_where=text(f"status IN {sql_list(states.Sequence.OPEN)}")),
)

sequence_visits = Table(
    "sequence_visits", metadata,
    Column("enrollment_id", BigInteger,
           ForeignKey("sequence_enrollments.id", ondelete="CASCADE"), nullable=False),
    Column("step_id", BigInteger, ForeignKey("sequence_steps.id", ondelete="CASCADE"),
           nullable=False),
    Column("job_id", BigInteger),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("outcome", Text, nullable=False),
    PrimaryKeyConstraint("enrollment_id", "step_id"),
    Index("sequence_visits_step_idx", "step_id", "outcome"),
)

sequence_links = Table(
    "sequence_links", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("step_id", BigInteger, ForeignKey("sequence_steps.id", ondelete="CASCADE"),
           nullable=False),
    Column("url", Text, nullable=False),
    UniqueConstraint("step_id", "url", name="sequence_links_step_url_key"),
)

# One row per open or click of a sequence's message (job_id: its (enrollment, step) job,
# no foreign key, like campaign_events). No IP address, no user agent.
sequence_events = Table(
    "sequence_events", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("step_id", BigInteger, ForeignKey("sequence_steps.id", ondelete="CASCADE"),
           nullable=False),
    Column("job_id", BigInteger, nullable=False),
    Column("subscriber_id", BigInteger, ForeignKey("subscribers.id", ondelete="CASCADE"),
           nullable=False),
    Column("kind", Text, nullable=False),
    Column("link_id", BigInteger, ForeignKey("sequence_links.id", ondelete="CASCADE")),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("kind IN ('open', 'click')", name="sequence_events_kind_check"),
    CheckConstraint("(kind = 'click') = (link_id IS NOT NULL)",
                    name="sequence_events_link_check"),
    Index("sequence_events_job_idx", "job_id", "kind"),
    Index("sequence_events_step_idx", "step_id", "kind"),
    Index("sequence_events_subscriber_idx", "subscriber_id", "kind", "at"),
    Index("sequence_events_link_idx", "link_id"),
)

events = Table(
    "events", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("name", Text, nullable=False),
    Column("subscriber_id", BigInteger, ForeignKey("subscribers.id", ondelete="CASCADE")),
    Column("user_ref", Text),
    Column("email", Text),
    Column("data", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("events_subscriber_idx", "subscriber_id", "name", "at"),
    Index("events_user_idx", "user_ref", "at", postgresql_where=text("user_ref IS NOT NULL")),
)

# Receiver reports (docs/deliverability.md): DMARC aggregate and failure reports and SMTP TLS
# reports, one row per report (the same org + report id is kept once), their records, and
# the files that could not be read, with the reason.
receiver_reports = Table(
    "receiver_reports", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("org_name", Text, nullable=False),
    Column("report_id", Text, nullable=False),
    Column("domain", Text, nullable=False),
    Column("begin_at", DateTime(timezone=True), nullable=False),
    Column("end_at", DateTime(timezone=True), nullable=False),
    Column("policy", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("warnings", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("records", Integer, nullable=False, server_default="0"),
    Column("messages", BigInteger, nullable=False, server_default="0"),
    Column("source", Text, nullable=False),
    Column("filename", Text, nullable=False, server_default=""),
    _now(),
    CheckConstraint("kind IN ('aggregate', 'failure', 'smtp_tls')",
                    name="receiver_reports_kind_check"),
    UniqueConstraint("org_name", "report_id", name="receiver_reports_org_report_key"),
    Index("receiver_reports_domain_idx", "domain", "begin_at"),
    Index("receiver_reports_created_idx", "created_at"),
)

receiver_report_records = Table(
    "receiver_report_records", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("report", BigInteger, ForeignKey("receiver_reports.id", ondelete="CASCADE"),
           nullable=False),
    Column("domain", Text, nullable=False),
    Column("day", Date, nullable=False),
    Column("reporter", Text, nullable=False),
    Column("source_ip", Text, nullable=False),
    Column("count", BigInteger, nullable=False),
    Column("disposition", Text, nullable=False),
    Column("dkim", Text, nullable=False),
    Column("spf", Text, nullable=False),
    Column("header_from", Text, nullable=False, server_default=""),
    Column("envelope_from", Text),
    Column("auth", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Index("receiver_report_records_domain_day_idx", "domain", "day"),
    Index("receiver_report_records_report_idx", "report"),
)

receiver_tls_policies = Table(
    "receiver_tls_policies", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("report", BigInteger, ForeignKey("receiver_reports.id", ondelete="CASCADE"),
           nullable=False),
    Column("policy_domain", Text, nullable=False),
    Column("day", Date, nullable=False),
    Column("reporter", Text, nullable=False),
    Column("policy_type", Text, nullable=False),
    Column("successful", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column("details", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Index("receiver_tls_policies_domain_day_idx", "policy_domain", "day"),
    Index("receiver_tls_policies_report_idx", "report"),
)

# The per-day summary of the records (docs/design.md §30), kept at intake in the records'
# transaction: what the domain page and the DMARC alarm read. Policy fields are '' when the
# report left them out.
dmarc_daily = Table(
    "dmarc_daily", metadata,
    Column("domain", Text, nullable=False),
    Column("day", Date, nullable=False),
    Column("reporter", Text, nullable=False),
    Column("source_ip", Text, nullable=False),
    Column("disposition", Text, nullable=False),
    Column("policy_p", Text, nullable=False),
    Column("policy_sp", Text, nullable=False),
    Column("policy_pct", Text, nullable=False),
    Column("messages", BigInteger, nullable=False),
    Column("dmarc_pass", BigInteger, nullable=False),
    Column("spf_aligned", BigInteger, nullable=False),
    Column("dkim_aligned", BigInteger, nullable=False),
    PrimaryKeyConstraint("domain", "day", "reporter", "source_ip", "disposition", "policy_p",
                         "policy_sp", "policy_pct", name="dmarc_daily_pkey"),
)

dmarc_daily_reports = Table(
    "dmarc_daily_reports", metadata,
    Column("domain", Text, nullable=False),
    Column("day", Date, nullable=False),
    Column("reporter", Text, nullable=False),
    Column("reports", BigInteger, nullable=False),
    PrimaryKeyConstraint("domain", "day", "reporter", name="dmarc_daily_reports_pkey"),
)

# Warm-up (docs/design.md §33): sending domains whose daily and hourly caps grow on a
# schedule (caps NULL: the built-in ramp), and what the pacer let out per domain and hour.
warmups = Table(
    "warmups", metadata,
    Column("domain", Text, primary_key=True),
    Column("started_on", Date, nullable=False),
    Column("caps", ARRAY(Integer)),
    Column("hour_share", Float, nullable=False, server_default="0.25"),
    _now(),
    CheckConstraint("hour_share > 0 AND hour_share <= 1", name="warmups_hour_share_check"),
)

warmup_sends = Table(
    "warmup_sends", metadata,
    Column("domain", Text, nullable=False),
    Column("hour", DateTime(timezone=True), nullable=False),
    Column("sent", Integer, nullable=False),
    PrimaryKeyConstraint("domain", "hour", name="warmup_sends_pkey"),
)

receiver_report_rejects = Table(
    "receiver_report_rejects", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("digest", Text, nullable=False, unique=True),
    Column("source", Text, nullable=False),
    Column("filename", Text, nullable=False, server_default=""),
    Column("reason", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    _now(),
    # The reason as message id and parameters, said in the reader's language (NULL: only
    # the English reason).
    Column("reason_i18n", JSONB),
    Index("receiver_report_rejects_created_idx", "created_at"),
)
