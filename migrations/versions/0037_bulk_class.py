"""imported mail keeps its class in /metrics: a batch's items queue one step
behind their class (``workers.core.states.BULK_STEP``), so the outcome counters derive
the class from the priority's range, not from its exact value

``senddock_count_outcomes`` labelled a job ``critical`` only at priority 0; an imported
verification (priority 1) was counted as ``lifecycle`` in ``senddock_messages_total`` and
the time-to-sent histogram. Critical is now every priority below lifecycle's (5), as
``workers.building.kinds.class_of`` says. The function is 0014's with that one test
changed; it keeps 0034's ``enable_nestloop = off``.

Revision ID: 0037_bulk_class
Revises: 0036_cheap_kind_check
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

revision = "0037_bulk_class"
down_revision = "0036_cheap_kind_check"
branch_labels = None
depends_on = None

OLD = "WHEN n.priority <= 0 THEN 'critical'"
NEW = "WHEN n.priority < 5 THEN 'critical'"


def _function(test: str) -> str:
    """0014's CREATE FUNCTION of the outcome counters, with ``test`` as the critical one."""
    spec = importlib.util.spec_from_file_location(
        "senddock_migration_0014", Path(__file__).with_name("0014_kinds.py"))
    assert spec is not None and spec.loader is not None
    kinds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kinds)
    create: str = kinds.OUTCOME_TRIGGER[0]
    assert OLD in create
    return create.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1) \
        .replace(OLD, test)


def _install(test: str) -> None:
    op.execute(_function(test))
    # CREATE OR REPLACE resets the function's settings: 0034's, again.
    op.execute("ALTER FUNCTION senddock_count_outcomes() SET enable_nestloop = off")


def upgrade() -> None:
    _install(NEW)


def downgrade() -> None:
    _install(OLD)
