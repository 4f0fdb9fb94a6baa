"""The real components as pytest fixtures, loaded as a plugin from ``tests/conftest.py``.

Each component has a session-scoped process fixture (started once, stopped at the end, only
what it started) and a cheap per-test fixture on top of it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.real import dovecot as _dovecot


@pytest.fixture(scope="session")
def dovecot_proc() -> Iterator[_dovecot.DovecotServer]:
    """A private Dovecot (IMAP, IMAPS, POP3, POP3S on loopback) for the whole session."""
    reason = _dovecot.missing()
    if reason:
        pytest.skip(reason)
    server = _dovecot.DovecotServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture()
def dovecot(dovecot_proc: _dovecot.DovecotServer) -> _dovecot.Mailbox:
    """A fresh, empty mailbox (its own login) on the session's Dovecot."""
    user = f"bounces-{secrets.token_hex(4)}"
    return _dovecot.Mailbox(dovecot_proc, user, dovecot_proc.add_user(user))
