"""Reading the UI's pages, for the tests and the screenshot pass (bench/screenshots.py):
which Chromium to drive, and the English left on a Spanish page.

The English side of the catalog is the list of what must not be seen: every message that
has a Spanish translation different from itself is cut at its placeholders, and each piece
of three words or more is an English fragment. A page's visible text and text attributes
(title, placeholder, aria-label, data-confirm) must contain none of them."""

from __future__ import annotations

import os
import re
import shutil
from functools import cache
from html import unescape
from pathlib import Path

from babel.messages.pofile import read_po

CATALOG = Path(__file__).resolve().parent.parent / "translations" / "es" / \
    "LC_MESSAGES" / "messages.po"
PLACEHOLDER = re.compile(r"%\(\w+\)s|%%|%s|\{\w*\}")
ATTRIBUTES = re.compile(r'\b(?:title|placeholder|aria-label|alt|data-confirm)="([^"]*)"')


def chromium_path() -> str | None:
    """``SENDDOCK_CHROMIUM``, else Debian's Chromium when present (None: Playwright's)."""
    explicit = os.environ.get("SENDDOCK_CHROMIUM")
    if explicit:
        return explicit
    for candidate in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


@cache
def english_fragments() -> frozenset[str]:
    """Pieces of three words or more of every message whose Spanish differs."""
    with CATALOG.open("rb") as f:
        catalog = read_po(f, locale="es")
    spanish = []
    found: set[str] = set()
    for m in catalog:
        if not m.id or not m.string:
            continue
        ids = m.id if isinstance(m.id, tuple) else (m.id,)
        strings = m.string if isinstance(m.string, tuple) else (m.string,)
        spanish.extend(str(s) for s in strings)
        for one in ids:
            if str(one) in strings:
                continue
            for piece in PLACEHOLDER.split(str(one)):
                piece = " ".join(piece.split()).strip(" .,:;()—-…“”\"'")
                if len(re.findall(r"[A-Za-z]{2,}", piece)) >= 3 and len(piece) >= 14:
                    found.add(piece)
    everything_spanish = "\n".join(spanish)
    # A fragment that a Spanish translation itself contains is not English-only.
    return frozenset(f for f in found if f not in everything_spanish)


def visible_text(html: str) -> str:
    html = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", html)
    attributes = " ".join(ATTRIBUTES.findall(html))
    html = re.sub(r"(?is)<(code|pre|textarea|iframe)\b.*?</\1>", " ", html)  # data
    text = re.sub(r"<[^>]+>", " ", html)
    return " ".join(unescape(f"{text} {attributes}").split())


def english_in(html: str) -> list[str]:
    text = visible_text(html)
    return sorted(f for f in english_fragments() if f in text)
