"""CSV written for spreadsheets, safe against formula injection (P10).

Every CSV SendDock produces goes through :class:`SafeWriter`, so every cell — header cells
included (a list's header row carries attribute *keys*, which subscribers' data chose) —
is neutralised the same way. A cell a spreadsheet would read as a formula gets a leading
apostrophe, which spreadsheets show as text and do not run.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

# What spreadsheet programs take as the start of a formula (OWASP "CSV injection"): the
# four operators, and tab/CR/LF, which some strip before looking at the first character.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def neutralise(value: Any) -> str:
    """``value`` as CSV cell text that no spreadsheet runs as a formula. None is empty;
    anything starting like a formula (after any leading spaces, which some programs
    skip) is prefixed with ``'``."""
    text = "" if value is None else str(value)
    return "'" + text if text.lstrip(" ").startswith(FORMULA_START) else text


class SafeWriter:
    """A ``csv.writer`` into an in-memory buffer that neutralises every cell it writes;
    :meth:`take` hands out what was written so far (for streaming a chunk at a time)."""

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer)

    def row(self, cells: Iterable[Any]) -> None:
        self._writer.writerow([neutralise(cell) for cell in cells])

    def take(self) -> str:
        text = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return text
