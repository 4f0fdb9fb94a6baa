"""RFC 3464 delivery-status fields, read leniently.

Real DSNs break the RFC's block structure: one block holding the per-message and the
per-recipient fields (McAfee), no blank line between recipient blocks (AOL), fields in a
text/plain part (Exchange 2007, Amazon WorkMail), folded diagnostic codes. So the fields are
read line by line and a recipient's group starts at its ``Original-Recipient`` or
``Final-Recipient`` line, wherever the blank lines are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]{1,40})\s*:\s*(.*)$")
_RECIPIENT_FIELDS = ("original-recipient", "final-recipient", "x-actual-recipient")
_PER_RECIPIENT = {"action", "status", "diagnostic-code", "remote-mta", "last-attempt-date",
                  "will-retry-until", "x-actual-recipient", "final-log-id",
                  "x-supplementary-info", "x-display-name"}
HAS_FIELDS = re.compile(r"^(?:final|original)-recipient\s*:", re.IGNORECASE | re.MULTILINE)


@dataclass
class Group:
    """One recipient's fields (names lower-cased) and the per-message ones."""

    fields: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> str:
        return self.fields.get(name, "")


def groups(text: str) -> tuple[dict[str, str], list[Group]]:
    """The per-message fields and the per-recipient groups of a delivery-status text."""
    per_message: dict[str, str] = {}
    found: list[Group] = []
    current: Group | None = None
    pending: dict[str, str] = {}
    after: set[str] = set()  # the current group's fields written after its recipient
    last: str | None = None
    for raw_line in text.replace("\r", "").split("\n"):
        if raw_line[:1] in (" ", "\t") and raw_line.strip() and last:
            target = current.fields if current and last in current.fields else per_message
            if last in target:
                target[last] += " " + raw_line.strip()
            continue
        match = _FIELD.match(raw_line.strip())
        if not match:
            last = None
            continue
        name, value = match[1].lower(), match[2].strip()
        if name in ("original-recipient", "final-recipient"):
            # A recipient's group starts at a recipient field the current group already
            # has, or after the current group got its action or status (either order of
            # Original- and Final-Recipient, with or without blank lines between groups).
            starts = current is None or name in current.fields or bool(
                after & {"action", "status", "diagnostic-code"})
            if starts:
                current = Group(dict(pending))  # fields written before the recipient's
                pending.clear()
                after = set()
                found.append(current)
            assert current is not None
            current.fields[name] = value
            last = name
        elif current is not None and (name in _PER_RECIPIENT or name.startswith("x-")):
            if name not in current.fields:
                current.fields[name] = value
                after.add(name)
            last = name if name in current.fields else None
        elif current is None and name in _PER_RECIPIENT:
            pending.setdefault(name, value)
            last = None
        else:
            per_message.setdefault(name, value)
            last = name
    return per_message, found


def address_field(value: str) -> str:
    """The address of ``rfc822; <a@b>`` (lower-cased; '' when there is none)."""
    if not value:
        return ""
    if ";" in value:
        value = value.split(";", 1)[1]
    found = re.search(r"[^\s<>\"';:,()\[\]]+@[^\s<>\"';:,()\[\]]+", value)
    return found[0].strip(".").lower() if found else ""


def diagnostic_field(value: str) -> tuple[str, str]:
    """``(type, text)`` of a Diagnostic-Code (``smtp; 550 …``)."""
    match = re.match(r"\s*([A-Za-z0-9-]{1,20})\s*;\s*(.*)$", value or "", re.DOTALL)
    if match:
        return match[1].upper(), match[2].strip()
    return "", (value or "").strip()
