"""What a text field may hold, said once: the checks the domain runs and the patterns the
OpenAPI document publishes are built from the same definitions here, so a fuzzer that
trusts the document and the server that checks the input agree (P9).
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls: never part of a name, an id, an address or a URL, and
# in a mail header CR and LF would start a new header.
CONTROL_CLASS = "\\x00-\\x1f\\x7f-\\x9f"
CONTROL = re.compile(f"[{CONTROL_CLASS}]")

# Patterns as published (JSON Schema, ECMA-262 syntax that Python's re reads the same way).
NO_NUL = "^[^\\x00]*$"
# Text with at least one character that is not white space, and no NUL.
NOT_BLANK = "^[^\\x00]*[^\\s\\x00][^\\x00]*$"
# Text with at least one character that is not white space, and no control character.
PLAIN_NOT_BLANK = f"^[^{CONTROL_CLASS}]*[^\\s{CONTROL_CLASS}][^{CONTROL_CLASS}]*$"
# Printable ASCII (space to tilde) with at least one character that is not a space.
PRINTABLE_ASCII_NOT_BLANK = "^[ -~]*[!-~][ -~]*$"
# An absolute http(s) URL: scheme, a host part, then anything but white space, controls
# and square brackets (only valid around an IPv6 host, which urlsplit would then check).
_URL_CHAR = f"[^\\s\\[\\]{CONTROL_CLASS}]"
HTTP_URL = f"^[hH][tT][tT][pP][sS]?://(?![/?#]){_URL_CHAR}+$"


def matches(pattern: str, text: str) -> bool:
    """Whether ``text`` matches the published ``pattern`` (as a validator reads it)."""
    return re.search(pattern, text) is not None


def control_character(text: str) -> str | None:
    """The first control character in ``text`` as ``U+XXXX`` (None when there is none)."""
    found = CONTROL.search(text)
    return f"U+{ord(found.group()):04X}" if found else None


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def _email_pattern() -> str:
    from email_validator import SPECIAL_USE_DOMAIN_NAMES

    reserved = "|".join(_any_case(name) for name in SPECIAL_USE_DOMAIN_NAMES)
    return (f"^(?![^@]*@(?:[^@]*\\.)?(?:{reserved})\\.?$)"
            f"[^@\\s{CONTROL_CLASS}]+@[^@\\s{CONTROL_CLASS}]+\\.[^@\\s{CONTROL_CLASS}]+$")


# What email-validator (lists.check_email) adds to JSON Schema's "email" format: a dotted
# domain that is not a special-use name (RFC 6761: .test, .localhost, .invalid, ...).
EMAIL = _email_pattern()

# "Name <address>" as a From header takes it, in a form email-validator always accepts:
# a display name without control characters or angle brackets, then a plain address
# (letters, digits and . _ + - in the local part; labels of letters, digits and inner
# hyphens; a top-level domain of letters that is not a special-use name).
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,20}[A-Za-z0-9])?"


def _named_address_pattern() -> str:
    from email_validator import SPECIAL_USE_DOMAIN_NAMES

    reserved = "|".join(_any_case(name) for name in SPECIAL_USE_DOMAIN_NAMES)
    return (f"^[^<>{CONTROL_CLASS}]{{0,60}}<[A-Za-z0-9]{{1,20}}(?:[._+-][A-Za-z0-9]{{1,20}}){{0,3}}"
            rf"@(?:{_LABEL}\.){{1,3}}(?!(?:{reserved})>)[A-Za-z]{{2,10}}>$")


NAMED_ADDRESS = _named_address_pattern()


# The largest id PostgreSQL's bigint holds; a number past it can name nothing.
MAX_ID = 2**63 - 1
_WHOLE = re.compile(r"[0-9]{1,19}")


def whole_number(text: str | None, *, high: int = MAX_ID) -> int | None:
    """``text`` as a whole number from 0 to ``high`` — ASCII digits only (``str.isdigit``
    also takes ``²``, which ``int()`` refuses, and ``int()`` refuses over 4,300 digits) —
    or None. For query and form values, so bad input is a clear answer, never a 500."""
    if text is None or not _WHOLE.fullmatch(text):
        return None
    value = int(text)
    return value if value <= high else None
