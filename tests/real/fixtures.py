"""Fixtures for the real components in :mod:`harness` (a pytest plugin, listed in
``tests/conftest.py``'s ``pytest_plugins``). Each component: a session-scoped fixture that
pays the setup once, and a cheap per-test fixture that owns and stops what it started."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import dns, pgcluster, postfix
from harness import dovecot as _dovecot
from webapp.pgserver import debian_bindir

# --- PostgreSQL: private clusters ------------------------------------------------------


@pytest.fixture(scope="session")
def pg_template() -> Iterator[Path]:
    """A stopped, initdb'd data dir with a migrated ``senddock`` database owned by the
    ordinary role ``senddock`` (copied per test). Skips when Debian's server binaries
    are absent or we are not root."""
    reason = pgcluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    bindir = debian_bindir()
    assert bindir is not None
    from webapp import db

    with pgcluster.template_cluster(bindir, migrate=db.upgrade) as datadir:
        yield datadir


@pytest.fixture()
def pg_clusters(pg_template: Path) -> Iterator[pgcluster.Clusters]:
    """Private clusters for this test: ``pg_clusters.primary(max_connections=20)``,
    ``.standby(primary)`` (synchronous by default), ``.small_disk("16m")``. Everything
    made is stopped (``-m immediate``) and unmounted at the end."""
    bindir = debian_bindir()
    assert bindir is not None
    clusters = pgcluster.Clusters(bindir, pg_template)
    try:
        yield clusters
    finally:
        clusters.close()


# --- Postfix: a private relay ------------------------------------------------------------


@pytest.fixture(scope="session")
def postfix_proc() -> Iterator[postfix.Postfix]:
    """One private Postfix for the session (see :mod:`harness.postfix` for its API).
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


# --- Dovecot: a private IMAP/POP3 server -------------------------------------------------


@pytest.fixture(scope="session")
def dovecot_proc() -> Iterator[_dovecot.DovecotServer]:
    """A private Dovecot (IMAP, IMAPS, POP3, POP3S on loopback) for the whole session.
    Skips with the packages to install when Dovecot is absent."""
    reason = _dovecot.missing()
    if reason:
        pytest.skip(reason)
    server = _dovecot.DovecotServer()
    try:
        server.start()
        # Dovecot's passwd-file is re-read at most once a second (it skips the stat when
        # it already looked in the same second), so a login added and used within one
        # second may be unknown (dovecot-lda exit 67). Logins are made up front instead.
        _spare_logins[:] = [(user, server.add_user(user)) for user in (
            f"bounces-{secrets.token_hex(4)}" for _ in range(SPARE_LOGINS))]
        time.sleep(1.1)
        yield server
    finally:
        server.cleanup()


SPARE_LOGINS = 24
_spare_logins: list[tuple[str, str]] = []


@pytest.fixture()
def dovecot(dovecot_proc: _dovecot.DovecotServer) -> _dovecot.Mailbox:
    """A fresh, empty mailbox (its own login) on the session's Dovecot."""
    if _spare_logins:
        user, password = _spare_logins.pop()
    else:
        user = f"bounces-{secrets.token_hex(4)}"
        password = dovecot_proc.add_user(user)
        time.sleep(1.1)  # see dovecot_proc
    return _dovecot.Mailbox(dovecot_proc, user, password)

# --- DNS: a local server answering from the test's zone ----------------------------------


@pytest.fixture(scope="session")
def dns_proc() -> Iterator[dns.DnsServer]:
    """dnslib's server on 127.0.0.1 (UDP and TCP, one free port) for the whole session:
    the process's shared one (see :func:`harness.dns.shared_server`)."""
    yield dns.shared_server()


@pytest.fixture()
def dns_server(dns_proc: dns.DnsServer) -> Iterator[dns.DnsServer]:
    """The session's DNS server with an empty zone and query log: the test publishes its
    records (``dns_server.zone.txt(name, value)``, ``.zone.add(name, "MX", host)``) and
    points ``SENDDOCK_DNS_RESOLVER`` at ``dns_server.resolver_setting``."""
    dns_proc.reset()
    yield dns_proc
    dns_proc.reset()
