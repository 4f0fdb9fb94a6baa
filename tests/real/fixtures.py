"""Fixtures for the real components in :mod:`tests.real` (a pytest plugin, listed in
``tests/conftest.py``'s ``pytest_plugins``). Each component: a session-scoped fixture that
pays the setup once, and a cheap per-test fixture that owns and stops what it started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real import pgcluster, postfix

# --- PostgreSQL: private clusters ------------------------------------------------------


@pytest.fixture(scope="session")
def pg_template() -> Iterator[Path]:
    """A stopped, initdb'd data dir with a migrated ``senddock`` database (copied per
    test). Skips when Debian's server binaries are absent or we are not root."""
    reason = pgcluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    bindir = pgcluster.find_bindir()
    assert bindir is not None
    from webapp import db

    with pgcluster.template_cluster(bindir, migrate=db.upgrade) as datadir:
        yield datadir


@pytest.fixture()
def pg_clusters(pg_template: Path) -> Iterator[pgcluster.Clusters]:
    """Private clusters for this test: ``pg_clusters.primary(max_connections=20)``,
    ``.standby(primary)`` (synchronous by default), ``.small_disk("16m")``. Everything
    made is stopped (``-m immediate``) and unmounted at the end."""
    bindir = pgcluster.find_bindir()
    assert bindir is not None
    clusters = pgcluster.Clusters(bindir, pg_template)
    try:
        yield clusters
    finally:
        clusters.close()


# --- Postfix: a private relay ------------------------------------------------------------


@pytest.fixture(scope="session")
def postfix_proc() -> Iterator[postfix.Postfix]:
    """One private Postfix for the session (see :mod:`tests.real.postfix` for its API).
    Skips with the packages to install when Postfix or Cyrus SASL is absent."""
    reason = postfix.unavailable_reason()
    if reason:
        pytest.skip(reason)
    instance = postfix.Postfix()
    try:
        instance.start()
        yield instance
    finally:
        instance.close()


@pytest.fixture()
def relay(postfix_proc: postfix.Postfix) -> postfix.Postfix:
    """The session's Postfix, reset for this test: base configuration, empty maps, only
    the default SASL user (``postfix.USER``/``postfix.PASSWORD``), empty mailbox and
    queue, log marked. Started again if a previous test stopped it."""
    postfix_proc.reset()
    return postfix_proc
