"""accounts: scoped API tokens, two-factor (TOTP)

``api_tokens.scopes`` (``webapp.access.SCOPES``) and ``last_used_addr``. A token that
existed before keeps what it could do: every scope its owner's role may hold.

Two-factor: ``users.totp_secret`` (sealed with the secret key), ``totp_enabled_at`` and
``totp_last_step`` (the last accepted time step: a code is refused on replay);
``recovery_codes`` (SHA-256 of each single-use code); ``second_factor_roles`` (roles whose
users must enrol); ``web_sessions.second_factor_at`` (the last check, for step-up).

Personal data: ``erased_addresses`` (the SHA-256 of each address erased on request, with the
reason it stays suppressed). Statement triggers on ``subscribers`` and ``delivery_jobs``
put such an address back on the suppression list when it is inserted again (a one-time
check: nothing is hashed while the table is empty).

Revision ID: 0040_accounts
Revises: 0037_bulk_class
"""

from __future__ import annotations

from alembic import op

revision = "0040_accounts"
down_revision = "0039_sequences"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE api_tokens
            ADD COLUMN scopes text[] NOT NULL DEFAULT '{}'::text[],
            ADD COLUMN last_used_addr text""")
    op.execute("""
        UPDATE api_tokens t SET scopes = CASE u.role
            WHEN 'admin' THEN ARRAY['send', 'read_jobs', 'campaigns', 'admin']
            WHEN 'marketer' THEN ARRAY['campaigns', 'read_jobs']
            ELSE ARRAY['send', 'read_jobs'] END
          FROM users u WHERE u.id = t.user_id""")
    op.execute("""
        ALTER TABLE users
            ADD COLUMN totp_secret text,
            ADD COLUMN totp_enabled_at timestamptz,
            ADD COLUMN totp_last_step bigint""")
    op.execute("ALTER TABLE web_sessions ADD COLUMN second_factor_at timestamptz")
    op.execute("""
        CREATE TABLE recovery_codes (
            id bigserial PRIMARY KEY,
            user_id bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            code_hash text NOT NULL,
            used_at timestamptz,
            created_at timestamptz NOT NULL DEFAULT now())""")
    op.execute("CREATE INDEX recovery_codes_user_idx ON recovery_codes (user_id)")
    op.execute("""
        CREATE TABLE second_factor_roles (
            role text PRIMARY KEY,
            created_at timestamptz NOT NULL DEFAULT now())""")
    op.execute("""
        CREATE TABLE erased_addresses (
            email_hash text PRIMARY KEY,
            reason text NOT NULL,
            erased_at timestamptz NOT NULL DEFAULT now())""")
    op.execute(RESTORE_FUNCTION)
    for table in ("subscribers", "delivery_jobs"):
        op.execute(f"""
            CREATE TRIGGER {table}_erased_suppressed AFTER INSERT ON {table}
            REFERENCING NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION senddock_suppress_erased()""")


RESTORE_FUNCTION = """
CREATE FUNCTION senddock_suppress_erased() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO suppressions (email, reason, note, created_by)
    SELECT DISTINCT lower(n.email), e.reason,
           'erased on request, suppressed again when the address came back',
           'personal data erase'
      FROM new_rows n
      JOIN erased_addresses e
        ON e.email_hash = encode(sha256(convert_to(lower(n.email), 'UTF8')), 'hex')
     WHERE EXISTS (SELECT 1 FROM erased_addresses)
    ON CONFLICT (email) DO NOTHING;
    RETURN NULL;
END $$"""


def downgrade() -> None:
    for table in ("subscribers", "delivery_jobs"):
        op.execute(f"DROP TRIGGER {table}_erased_suppressed ON {table}")
    op.execute("DROP FUNCTION senddock_suppress_erased()")
    op.execute("DROP TABLE erased_addresses")
    op.execute("DROP TABLE second_factor_roles")
    op.execute("DROP TABLE recovery_codes")
    op.execute("ALTER TABLE web_sessions DROP COLUMN second_factor_at")
    op.execute("ALTER TABLE users DROP COLUMN totp_secret, DROP COLUMN totp_enabled_at, "
               "DROP COLUMN totp_last_step")
    op.execute("ALTER TABLE api_tokens DROP COLUMN scopes, DROP COLUMN last_used_addr")
