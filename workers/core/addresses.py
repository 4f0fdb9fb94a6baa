"""Email addresses as the engine and the web app read them (docs/design.md §19).

:func:`domain_of` is the one place "the domain of an address" is computed: recipient domains
(domain throttles, the reply judge), From domains (Message-IDs, DKIM, List-Id, sending-domain
checks), bounce-address domains and disposable-domain flags all go through it.
"""

from __future__ import annotations

from email.utils import parseaddr


def domain_of(address: str) -> str:
    """The domain of an email address: lower-case, without surrounding whitespace or a
    trailing dot. Accepts a bare address (``Jane@Example.COM``), one in angle brackets, or a
    header field with a display name (``"Jane" <jane@example.com>``).

    A malformed address — no ``@``, or nothing after the last one — has no domain and gives
    ``""``; it never raises. Callers that need a domain whatever happens (Message-IDs) add
    their own fallback: ``domain_of(a) or "senddock.local"``."""
    if "<" in address or '"' in address or "(" in address:
        address = parseaddr(address)[1]
    _, at, domain = address.strip().rpartition("@")
    if not at:
        return ""
    return domain.strip().rstrip(">").strip().lower().rstrip(".")
