"""after acceptance: bounce and complaint events, webhook tokens and receipts, outgoing
event webhooks (endpoints, the delivery queue and the triggers that fill it), the
complaint counter on broadcasts and the pause reason on campaigns (docs/design.md §18)

Revision ID: 0015
Revises: 0019
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0015'
down_revision = '0019'
branch_labels = None
depends_on = None

# Outgoing events are queued by triggers in the transaction that made the change, so an
# event exists exactly when its change committed (nothing to lose between the two). Each
# first checks that some endpoint wants the event: with none configured the hot path pays
# one index-less probe of a tiny table per statement.
EVENT_TRIGGERS = [
    """
    CREATE FUNCTION senddock_event_payload(ev text, j delivery_jobs, reason text)
    RETURNS jsonb LANGUAGE sql STABLE AS $$
      SELECT jsonb_build_object(
        'type', 'message.' || ev,
        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'data', jsonb_build_object(
          'event', ev, 'job_id', j.id, 'kind', j.kind, 'user_id', j.user_ref,
          'correlation_id', j.correlation_id, 'email', j.email,
          'campaign_id', j.campaign_id, 'message_id', j.message_id,
          'reason', reason, 'source_event', j.payload -> 'event'))
    $$
    """,
    """
    CREATE FUNCTION senddock_job_events_out() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled) THEN
        RETURN NULL;
      END IF;
      INSERT INTO webhook_deliveries (endpoint_id, event, payload)
      SELECT e.id, x.ev, senddock_event_payload(x.ev, n, n.last_error)
        FROM new_rows n JOIN old_rows o ON o.id = n.id
       CROSS JOIN LATERAL (SELECT n.status AS ev) x
        JOIN webhook_endpoints e ON e.enabled AND x.ev = ANY(e.events)
             AND (cardinality(e.kinds) = 0 OR n.kind = ANY(e.kinds))
       WHERE n.status IS DISTINCT FROM o.status AND n.status IN ('sent', 'failed', 'bounced');
      RETURN NULL;
    END $$
    """,
    """CREATE TRIGGER delivery_jobs_event_webhooks AFTER UPDATE ON delivery_jobs
       REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION senddock_job_events_out()""",
    """
    CREATE FUNCTION senddock_complaints_out() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled) THEN
        RETURN NULL;
      END IF;
      INSERT INTO webhook_deliveries (endpoint_id, event, payload)
      SELECT e.id, 'complained', senddock_event_payload('complained', j, n.reason)
        FROM new_rows n JOIN delivery_jobs j ON j.id = n.job_id
        JOIN webhook_endpoints e ON e.enabled AND 'complained' = ANY(e.events)
             AND (cardinality(e.kinds) = 0 OR j.kind = ANY(e.kinds))
       WHERE n.type = 'complaint';
      RETURN NULL;
    END $$
    """,
    """CREATE TRIGGER job_events_event_webhooks AFTER INSERT ON job_events
       REFERENCING NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION senddock_complaints_out()""",
    """
    CREATE FUNCTION senddock_unsubscribes_out() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled) THEN
        RETURN NULL;
      END IF;
      INSERT INTO webhook_deliveries (endpoint_id, event, payload)
      SELECT e.id, 'unsubscribed',
             CASE WHEN j.id IS NOT NULL THEN senddock_event_payload('unsubscribed', j, n.note)
             ELSE jsonb_build_object(
               'type', 'message.unsubscribed',
               'timestamp', to_char(now() AT TIME ZONE 'UTC',
                                    'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'data', jsonb_build_object('event', 'unsubscribed', 'email', n.email,
                                          'reason', n.note)) END
        FROM new_rows n LEFT JOIN delivery_jobs j ON j.id = n.job_id
        JOIN webhook_endpoints e ON e.enabled AND 'unsubscribed' = ANY(e.events)
             AND (cardinality(e.kinds) = 0 OR j.kind IS NULL OR j.kind = ANY(e.kinds))
       WHERE n.reason = 'unsubscribed';
      RETURN NULL;
    END $$
    """,
    """CREATE TRIGGER suppressions_event_webhooks AFTER INSERT ON suppressions
       REFERENCING NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION senddock_unsubscribes_out()""",
]


def upgrade() -> None:
    op.add_column('campaigns', sa.Column('paused_reason', sa.Text(), nullable=True))
    op.add_column('broadcasts', sa.Column('complaints', sa.Integer(), server_default=sa.text('0'),
                                          nullable=False))
    op.create_table(
        'job_events',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('job_id', sa.BigInteger(), nullable=True),
        sa.Column('source', sa.Text(), nullable=False),
        sa.Column('type', sa.Text(), nullable=False),
        sa.Column('bounce', sa.Text(), nullable=True),
        sa.Column('email', sa.Text(), nullable=False),
        sa.Column('reason', sa.Text(), server_default='', nullable=False),
        sa.Column('status', sa.Text(), nullable=True),
        sa.Column('event_id', sa.Text(), nullable=True),
        sa.Column('message_id', sa.Text(), nullable=True),
        sa.Column('effect', sa.Text(), nullable=False),
        sa.Column('raw', sa.Text(), server_default='', nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.CheckConstraint("source IN ('mailbox', 'ses', 'sendgrid', 'postmark', 'mailgun', 'generic')", name='job_events_source_check'),
        sa.CheckConstraint("type IN ('bounce', 'complaint')", name='job_events_type_check'),
        sa.CheckConstraint("bounce IS NULL OR bounce IN ('hard', 'soft')", name='job_events_bounce_check'),
        sa.ForeignKeyConstraint(['job_id'], ['delivery_jobs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('job_events_job_idx', 'job_events', ['job_id', 'created_at'])
    op.create_index('job_events_email_idx', 'job_events', [sa.text('lower(email)'), 'created_at'])
    op.create_index('job_events_created_idx', 'job_events', ['created_at'])
    op.create_index('job_events_event_key', 'job_events', ['source', 'event_id'], unique=True,
                    postgresql_where=sa.text('event_id IS NOT NULL'))
    op.create_table(
        'feedback_receipts',
        sa.Column('source', sa.Text(), nullable=False),
        sa.Column('key', sa.Text(), nullable=False),
        sa.Column('received_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('source', 'key'),
    )
    op.create_index('feedback_receipts_received_idx', 'feedback_receipts', ['received_at'])
    op.create_table(
        'webhook_tokens',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('name', sa.Text(), server_default='', nullable=False),
        sa.Column('prefix', sa.Text(), nullable=False),
        sa.Column('token_hash', sa.Text(), nullable=False),
        sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('token_hash'),
    )
    op.create_table(
        'webhook_endpoints',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('description', sa.Text(), server_default='', nullable=False),
        sa.Column('events', postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column('kinds', postgresql.ARRAY(sa.Text()), server_default=sa.text("'{}'::text[]"), nullable=False),
        sa.Column('secret', sa.Text(), nullable=False),
        sa.Column('enabled', sa.Boolean(), server_default=sa.text('true'), nullable=False),
        sa.Column('disabled_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('disabled_reason', sa.Text(), nullable=True),
        sa.Column('consecutive_failures', sa.Integer(), server_default=sa.text('0'), nullable=False),
        sa.Column('last_attempt_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_success_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_status', sa.SmallInteger(), nullable=True),
        sa.Column('last_response', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_table(
        'webhook_deliveries',
        sa.Column('id', sa.BigInteger(), nullable=False),
        sa.Column('endpoint_id', sa.BigInteger(), nullable=False),
        sa.Column('event', sa.Text(), nullable=False),
        sa.Column('msg_id', sa.Text(), server_default=sa.text("'msg_' || replace(gen_random_uuid()::text, '-', '')"), nullable=False),
        sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column('status', sa.Text(), server_default='pending', nullable=False),
        sa.Column('attempts', sa.SmallInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('available_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('claimed_by', sa.Text(), nullable=True),
        sa.Column('claim_token', sa.UUID(as_uuid=False), nullable=True),
        sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_status', sa.SmallInteger(), nullable=True),
        sa.Column('last_response', sa.Text(), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'sending', 'retry', 'delivered', 'failed')", name='webhook_deliveries_status_check'),
        sa.ForeignKeyConstraint(['endpoint_id'], ['webhook_endpoints.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('webhook_deliveries_claim_idx', 'webhook_deliveries', ['available_at', 'id'],
                    postgresql_where=sa.text("status IN ('pending', 'retry')"))
    op.create_index('webhook_deliveries_sending_idx', 'webhook_deliveries', ['claimed_at'],
                    postgresql_where=sa.text("status = 'sending'"))
    op.create_index('webhook_deliveries_endpoint_idx', 'webhook_deliveries',
                    ['endpoint_id', 'created_at'])
    for statement in EVENT_TRIGGERS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS suppressions_event_webhooks ON suppressions")
    op.execute("DROP TRIGGER IF EXISTS delivery_jobs_event_webhooks ON delivery_jobs")
    op.execute("DROP FUNCTION IF EXISTS senddock_unsubscribes_out() CASCADE")
    op.execute("DROP FUNCTION IF EXISTS senddock_complaints_out() CASCADE")
    op.execute("DROP FUNCTION IF EXISTS senddock_job_events_out() CASCADE")
    op.drop_table('webhook_deliveries')
    op.drop_table('webhook_endpoints')
    op.drop_table('webhook_tokens')
    op.drop_table('feedback_receipts')
    op.drop_table('job_events')
    op.execute("DROP FUNCTION IF EXISTS senddock_event_payload(text, delivery_jobs, text)")
    op.drop_column('broadcasts', 'complaints')
    op.drop_column('campaigns', 'paused_reason')
