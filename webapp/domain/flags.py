"""What support should know about an address before it is sent to (docs/design.md §21): a disposable
domain (the maintained ``disposable-email-domains`` list) and the suppression list."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from disposable_email_domains import allowlist, blocklist
from sqlalchemy.engine import Connection

from workers.core.addresses import domain_of

FLAG_DISPOSABLE = "disposable_domain"
FLAG_SUPPRESSED = "suppressed"


def disposable_domain(email: str) -> str | None:
    """The listed disposable domain the address belongs to (its domain or a parent of it,
    per the maintained ``disposable-email-domains`` list), or None."""
    domain = domain_of(email)
    labels = domain.split(".")
    for i in range(len(labels) - 1):
        candidate = ".".join(labels[i:])
        if candidate in allowlist:
            return None
        if candidate in blocklist:
            return candidate
    return None


def suppression(conn: Connection, email: str) -> dict[str, Any] | None:
    """The address's suppression entry (reason, created_at), or None."""
    row = conn.execute(sa.text("SELECT reason, created_at FROM suppressions "
                               "WHERE email = lower(:email)"), {"email": email}).mappings().first()
    return dict(row) if row else None


def flags_for(conn: Connection, email: str) -> list[str]:
    """The address's flags as a job records them."""
    flags = []
    if disposable_domain(email):
        flags.append(FLAG_DISPOSABLE)
    if suppression(conn, email):
        flags.append(FLAG_SUPPRESSED)
    return flags
