"""marketers: subscription forms with double opt-in. Each list may have
a public form (``list_forms``: on/off, title, intro, accent colour); every request through
it or the public API is a ``subscription_requests`` row (the consent: when, from which IP,
through which form, and when it was confirmed). A pending request is not a membership, so
no campaign can reach it. The confirmation email is the kind ``subscription_confirmation``.

Revision ID: 0027_marketers
Revises: 0022ui
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027_marketers"
down_revision = "0022ui"
branch_labels = None
depends_on = None

SUBJECT = ("{% if data.locale == 'es' %}Confirma tu suscripción a {{ data.list_name }}"
           "{% else %}Confirm your subscription to {{ data.list_name }}{% endif %}")
TEXT = """{% if data.locale == 'es' %}Hola:

Alguien (esperamos que tú) pidió suscribir {{ email }} a «{{ data.list_name }}».
Para confirmarlo, abre este enlace:

{{ data.confirm_url }}

Si no fuiste tú, ignora este mensaje: no recibirás nada más.
{% else %}Hello,

Someone (we hope you) asked to subscribe {{ email }} to "{{ data.list_name }}".
To confirm, open this link:

{{ data.confirm_url }}

If it was not you, ignore this message: you will get nothing more.
{% endif %}"""


def upgrade() -> None:
    op.create_table(
        "list_forms",
        sa.Column("list_id", sa.BigInteger,
                  sa.ForeignKey("lists.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("title", sa.Text, nullable=False, server_default=""),
        sa.Column("intro", sa.Text, nullable=False, server_default=""),
        sa.Column("accent", sa.Text, nullable=False, server_default="#2b6cb0"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.CheckConstraint("accent ~ '^#[0-9a-fA-F]{6}$'", name="list_forms_accent_check"),
    )
    op.create_table(
        "subscription_requests",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("list_id", sa.BigInteger,
                  sa.ForeignKey("lists.id", ondelete="CASCADE"), nullable=False),
        sa.Column("email", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("locale", sa.Text, nullable=False, server_default="en"),
        sa.Column("remote_addr", sa.Text, nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False,
                  server_default=sa.text("now()")),
        sa.Column("confirmed_at", sa.DateTime(timezone=True)),
        sa.Column("confirmed_addr", sa.Text),
        sa.CheckConstraint("source IN ('form', 'api')", name="subscription_requests_source_check"),
    )
    op.create_index("subscription_requests_addr_idx", "subscription_requests",
                    ["remote_addr", "requested_at"])
    op.create_index("subscription_requests_list_email_idx", "subscription_requests",
                    ["list_id", sa.literal_column("lower(email)")])
    op.get_bind().execute(sa.text("""
        INSERT INTO kinds (name, class, description, subject, text_body, retry_schedule,
                           resend_cooldown, dedupe_window, sample_data)
        VALUES ('subscription_confirmation', 'critical',
                'Double opt-in: confirm a subscription made through a list form', :subject,
                :text, ARRAY[30, 120, 600, 3600], 60, 600,
                '{"list_name": "Newsletter", "locale": "en",
                  "confirm_url": "https://senddock.example/subscribe/confirm/sample"}')
        ON CONFLICT (name) DO NOTHING"""), {"subject": SUBJECT, "text": TEXT})


def downgrade() -> None:
    op.execute("DELETE FROM kinds WHERE name = 'subscription_confirmation'")
    op.drop_table("subscription_requests")
    op.drop_table("list_forms")
