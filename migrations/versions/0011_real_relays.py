"""real relays: throttles, login state, rate limits on the database clock

Revision ID: 0011
Revises: 0016
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for column in (sa.Column('reason', sa.Text(), nullable=True),
                   sa.Column('smtp_fingerprint', sa.Text(), nullable=True),
                   sa.Column('probe_recipient', sa.Text(), nullable=True),
                   sa.Column('throttled_until', sa.DateTime(timezone=True), nullable=True),
                   sa.Column('throttle_reply', sa.Text(), nullable=True),
                   sa.Column('throttle_hits', sa.Integer(), server_default=sa.text('0'),
                             nullable=False)):
        op.add_column('relay_state', column)
    op.create_table('domain_throttles',
    sa.Column('domain', sa.Text(), nullable=False),
    sa.Column('until', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_reply', sa.Text(), nullable=True),
    sa.Column('hits', sa.Integer(), server_default=sa.text('1'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'),
              nullable=False),
    sa.PrimaryKeyConstraint('domain')
    )
    op.create_table('rate_limiter',
    sa.Column('id', sa.SmallInteger(), nullable=False),
    sa.Column('tat', sa.DateTime(timezone=True), server_default=sa.text('now()'),
              nullable=False),
    sa.CheckConstraint('id = 1', name='rate_limiter_single_row'),
    sa.PrimaryKeyConstraint('id')
    )
    op.execute("INSERT INTO rate_limiter (id) VALUES (1)")
    op.create_table('rate_minutes',
    sa.Column('minute', sa.DateTime(timezone=True), nullable=False),
    sa.Column('used', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('minute')
    )
    op.drop_table('rate_windows')


def downgrade() -> None:
    op.create_table('rate_windows',
    sa.Column('second', sa.BigInteger(), nullable=False),
    sa.Column('used', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('second')
    )
    op.drop_table('rate_minutes')
    op.drop_table('rate_limiter')
    op.drop_table('domain_throttles')
    for name in ('throttle_hits', 'throttle_reply', 'throttled_until', 'probe_recipient',
                 'smtp_fingerprint', 'reason'):
        op.drop_column('relay_state', name)
