"""engine: claim paths without paused backlogs, per-kind counters, attempt kinds,
attempt numbers across manual retries

Revision ID: 0012
Revises: 0018
Create Date: 2026-12-01 10:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0018'
branch_labels = None
depends_on = None

# The count trigger of 0001, plus exact per-(kind, status) counters for the jobs that
# belong to no broadcast (verification, test, …): the stats read a few counter rows
# instead of counting every such job ever sent.
_BROADCAST_PART = {
    "INSERT": """
        INSERT INTO broadcast_counts AS c (broadcast_id, status, slot, n)
        SELECT broadcast_id, status, pg_backend_pid() % 16, count(*)
          FROM new_rows WHERE broadcast_id IS NOT NULL
         GROUP BY broadcast_id, status ORDER BY broadcast_id, status
        ON CONFLICT (broadcast_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;""",
    "UPDATE": """
        INSERT INTO broadcast_counts AS c (broadcast_id, status, slot, n)
        SELECT broadcast_id, status, pg_backend_pid() % 16, sum(d)
          FROM (SELECT broadcast_id, status, -1 AS d FROM old_rows WHERE broadcast_id IS NOT NULL
                UNION ALL
                SELECT broadcast_id, status, 1 FROM new_rows WHERE broadcast_id IS NOT NULL) x
         GROUP BY broadcast_id, status HAVING sum(d) <> 0 ORDER BY broadcast_id, status
        ON CONFLICT (broadcast_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;""",
    "DELETE": """
        INSERT INTO broadcast_counts AS c (broadcast_id, status, slot, n)
        SELECT broadcast_id, status, pg_backend_pid() % 16, -count(*)
          FROM old_rows WHERE broadcast_id IS NOT NULL
           AND EXISTS (SELECT 1 FROM broadcasts b WHERE b.id = old_rows.broadcast_id)
         GROUP BY broadcast_id, status ORDER BY broadcast_id, status
        ON CONFLICT (broadcast_id, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;""",
}
_KIND_PART = {
    "INSERT": """
        INSERT INTO kind_counts AS c (kind, status, slot, n)
        SELECT kind, status, pg_backend_pid() % 16, count(*)
          FROM new_rows WHERE broadcast_id IS NULL
         GROUP BY kind, status ORDER BY kind, status
        ON CONFLICT (kind, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;""",
    "UPDATE": """
        INSERT INTO kind_counts AS c (kind, status, slot, n)
        SELECT kind, status, pg_backend_pid() % 16, sum(d)
          FROM (SELECT kind, status, -1 AS d FROM old_rows WHERE broadcast_id IS NULL
                UNION ALL
                SELECT kind, status, 1 FROM new_rows WHERE broadcast_id IS NULL) x
         GROUP BY kind, status HAVING sum(d) <> 0 ORDER BY kind, status
        ON CONFLICT (kind, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;""",
    "DELETE": """
        INSERT INTO kind_counts AS c (kind, status, slot, n)
        SELECT kind, status, pg_backend_pid() % 16, -count(*)
          FROM old_rows WHERE broadcast_id IS NULL
         GROUP BY kind, status ORDER BY kind, status
        ON CONFLICT (kind, status, slot) DO UPDATE SET n = c.n + EXCLUDED.n;""",
}


def _count_function(with_kinds: bool) -> str:
    def body(op_name: str) -> str:
        return _BROADCAST_PART[op_name] + (_KIND_PART[op_name] if with_kinds else "")

    return f"""
    CREATE OR REPLACE FUNCTION senddock_count_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_OP = 'INSERT' THEN {body("INSERT")}
      ELSIF TG_OP = 'UPDATE' THEN {body("UPDATE")}
      ELSE {body("DELETE")}
      END IF;
      RETURN NULL;
    END $$
    """


def upgrade() -> None:
    # Attempt numbers go on across manual retries; the retry schedule restarts here.
    op.add_column('delivery_jobs', sa.Column('retry_base', sa.SmallInteger(),
                                             server_default=sa.text('0'), nullable=False))
    # The attempts-per-minute stats read the kind from the attempt, not from its job.
    op.add_column('job_attempts', sa.Column('kind', sa.Text(), nullable=True))
    op.execute("UPDATE job_attempts a SET kind = j.kind FROM delivery_jobs j "
               "WHERE j.id = a.job_id")
    # Claim paths: transactional jobs from their own index, each broadcast's due jobs from
    # its own range, so a paused campaign's backlog is never read.
    op.drop_index('delivery_jobs_claim_idx', table_name='delivery_jobs')
    op.create_index('delivery_jobs_claim_idx', 'delivery_jobs',
                    ['priority', 'available_at', 'id'], unique=False,
                    postgresql_where=sa.text("status IN ('pending', 'retry') "
                                             "AND broadcast_id IS NULL"))
    op.create_index('delivery_jobs_broadcast_due_idx', 'delivery_jobs',
                    ['broadcast_id', 'available_at', 'id'], unique=False,
                    postgresql_where=sa.text("status IN ('pending', 'retry')"))
    op.create_table('kind_counts',
                    sa.Column('kind', sa.Text(), nullable=False),
                    sa.Column('status', sa.Text(), nullable=False),
                    sa.Column('slot', sa.SmallInteger(), nullable=False),
                    sa.Column('n', sa.BigInteger(), server_default=sa.text('0'),
                              nullable=False),
                    sa.PrimaryKeyConstraint('kind', 'status', 'slot'),
                    postgresql_with={'fillfactor': '50'})
    op.execute("ALTER TABLE kind_counts SET (autovacuum_vacuum_scale_factor = 0.0, "
               "autovacuum_vacuum_threshold = 1000)")
    op.execute("LOCK TABLE delivery_jobs IN SHARE ROW EXCLUSIVE MODE")
    op.execute("INSERT INTO kind_counts (kind, status, slot, n) SELECT kind, status, 0, "
               "count(*) FROM delivery_jobs WHERE broadcast_id IS NULL GROUP BY kind, status")
    op.execute(_count_function(with_kinds=True))


def downgrade() -> None:
    op.execute(_count_function(with_kinds=False))
    op.drop_table('kind_counts')
    op.drop_index('delivery_jobs_broadcast_due_idx', table_name='delivery_jobs')
    op.drop_index('delivery_jobs_claim_idx', table_name='delivery_jobs')
    op.create_index('delivery_jobs_claim_idx', 'delivery_jobs',
                    ['priority', 'available_at', 'id'], unique=False,
                    postgresql_where=sa.text("status IN ('pending', 'retry')"))
    op.drop_column('job_attempts', 'kind')
    op.drop_column('delivery_jobs', 'retry_base')
