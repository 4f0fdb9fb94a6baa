"""The migrations produce exactly the models' schema."""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from webapp.models import metadata


def test_migrations_match_models(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn)
        diff = compare_metadata(context, metadata)
    assert diff == [], f"migrations and models differ: {diff}"


def test_count_triggers_installed(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        names = set(conn.execute(sa.text(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'delivery_jobs'::regclass "
            "AND NOT tgisinternal")).scalars())
    assert names == {"delivery_jobs_count_insert", "delivery_jobs_count_update",
                     "delivery_jobs_count_delete", "delivery_jobs_outcomes",
                     # outgoing event webhooks (migration 0015)
                     "delivery_jobs_event_webhooks",
                     # illegal status moves refused (migration 0021_arch)
                     "delivery_jobs_legal_move",
                     # an erased address inserted again is suppressed again (0040_accounts)
                     "delivery_jobs_erased_suppressed"}


def test_state_and_kind_checks_are_the_engine_vocabulary(engine: sa.Engine) -> None:
    """The CHECK constraints in the database list exactly workers.core.states' names."""
    from workers.core import states

    with engine.connect() as conn:
        defs = dict(conn.execute(sa.text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'delivery_jobs'::regclass AND contype = 'c'")).all())

    def names(constraint: str) -> set[str]:
        return set(re.findall(r"'([a-z_]+)'::text", defs[constraint]))

    assert names("delivery_jobs_status_check") == set(states.STATES)
    # Kinds are data (docs/design.md §21): the check holds the name rule every kind follows, in the
    # form PostgreSQL evaluates fastest (migration 0036), admitting exactly KIND_NAME's names.
    assert "'^[a-z][a-z0-9_-]*$'" in defs["delivery_jobs_kind_check"]
    assert "length(kind) <= 40" in defs["delivery_jobs_kind_check"]
    assert all(re.fullmatch(states.KIND_NAME, kind) for kind in states.KINDS)
    tried = [*states.KINDS, "a", "a" * 40, "a" * 41, "b2b_news-letter", "2fa", "Verify",
             "_x", "-x", "x y", "x.y", "é", "xé", "", "a\n", "a" * 39 + "é"]
    with engine.connect() as conn:
        admitted = dict(conn.execute(sa.text(
            f"SELECT kind, coalesce({states.KIND_CHECK}, false) "
            "FROM unnest(CAST(:tried AS text[])) AS t(kind)"), {"tried": tried}).all())
    assert admitted == {k: re.fullmatch(states.KIND_NAME, k) is not None for k in tried}


def test_the_exclusion_constraints_are_the_models(engine: sa.Engine) -> None:
    """Alembic does not compare EXCLUDE constraints: check the ones the dedupe window and
    the address cooldown rely on by hand, against the model's."""
    from sqlalchemy.dialects.postgresql import ExcludeConstraint

    from webapp.models import delivery_jobs

    models = {c.name: c for c in delivery_jobs.constraints if isinstance(c, ExcludeConstraint)}
    expected = {
        "delivery_jobs_dedupe_excl": ("EXCLUDE USING gist (user_ref WITH =, kind WITH =, "
                                      "tstzrange(created_at, dedupe_until) WITH &&)",
                                      "dedupe_until IS NOT NULL"),
        "delivery_jobs_cooldown_excl": ("EXCLUDE USING gist (hashtextextended(((kind || ' '::text)"
                                        " || lower(email)), (0)::bigint) WITH =, "
                                        "tstzrange(created_at, cooldown_until) WITH &&)",
                                        "cooldown_until IS NOT NULL"),
    }
    assert set(models) == set(expected)
    with engine.connect() as conn:
        found = dict(conn.execute(sa.text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'delivery_jobs'::regclass AND contype = 'x'")).all())
    assert set(found) == set(expected)
    for name, (head, condition) in expected.items():
        assert found[name].startswith(head), found[name]
        assert condition in found[name] and "'cancelled'" in found[name]
        assert models[name].using == "gist"


def test_builtin_verification_kind_is_the_shipped_template(engine: sa.Engine) -> None:
    from workers.building.compose import MAIL_TEMPLATES

    def read(name: str) -> str:
        return (MAIL_TEMPLATES / name).read_text(encoding="utf-8")

    shipped = (read("verification_subject.txt").strip(), read("verification.txt"),
               read("verification.html"))
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT class, subject, text_body, html_body, builtin "
                                   "FROM kinds WHERE name = 'verification'")).one()
    assert (row.subject, row.text_body, row.html_body) == shipped
    assert row.builtin and row[0] == "critical"


def test_one_migration_head() -> None:
    """Parallel branches each add a migration: after a merge they must form one chain."""
    from alembic.script import ScriptDirectory

    from webapp.db import alembic_config

    heads = ScriptDirectory.from_config(alembic_config("postgresql://unused/db")).get_heads()
    assert len(heads) == 1, f"several Alembic heads: {heads}; chain the newest migrations"
