"""CSV import into a list: streamed line by line (never the whole file in memory), every
rejected line reported with its number and reason, the rest imported (P9).

Accepted files: UTF-8 with or without a byte-order mark, comma- or semicolon-separated, a
header row naming an ``email`` column; ``name`` and any other columns are optional (the
others become attributes).
"""

from __future__ import annotations

import csv
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from webapp.domain import audit, text_limits
from webapp.domain.errors import Invalid
from webapp.domain.lists import (
    SubscriberInput,
    check_email,
    get_list,
    upsert_subscribers,
    would_upsert,
)
from workers.core.i18n import N_, Text

BATCH = 2000
MAX_REPORTED = 1000
EMAIL_HEADERS = ("email", "e-mail", "email address", "e-mail address", "mail")
NAME_HEADERS = ("name", "full name", "full_name")
_BOM = b"\xef\xbb\xbf"
SAMPLE_ROWS = 5
MAX_LINES_LISTED = 20
ROLES = ("email", "name", "attribute", "skip")
# A subscriber file has an address, a name and some attributes, not thousands of columns;
# the mapping step shows one choice per column.
MAX_COLUMNS = 1000


@dataclass
class Rejected:
    line: int
    email: str
    reason: str
    detail: str


@dataclass
class ImportReport:
    """What an import did. ``rejected`` lists the first :data:`MAX_REPORTED` rejected lines;
    ``reasons`` counts them all."""

    lines: int = 0
    added: int = 0
    updated: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    # The file's shape: its header, the columns as read, the first rows (for the mapping
    # step), and the lines that had more or fewer fields than the header.
    header: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    sample: list[list[str]] = field(default_factory=list)
    extra: int = 0
    extra_lines: list[int] = field(default_factory=list)
    short: int = 0
    short_lines: list[int] = field(default_factory=list)
    missing: Counter[str] = field(default_factory=Counter)
    dry_run: bool = False

    def shape(self, line: int, row: list[str]) -> None:
        """Note a row whose field count differs from the header's."""
        if len(self.sample) < SAMPLE_ROWS:
            self.sample.append(row[:len(self.header) + 3])
        if len(row) > len(self.header):
            self.extra += 1
            if len(self.extra_lines) < MAX_LINES_LISTED:
                self.extra_lines.append(line)
        elif len(row) < len(self.header):
            self.short += 1
            if len(self.short_lines) < MAX_LINES_LISTED:
                self.short_lines.append(line)
            for name in self.header[len(row):]:
                self.missing[name.strip() or "(unnamed)"] += 1

    @property
    def rejected_total(self) -> int:
        return sum(self.reasons.values())

    def reject(self, line: int, email: str, reason: str, detail: str) -> None:
        self.reasons[reason] += 1
        if len(self.rejected) < MAX_REPORTED:
            self.rejected.append(Rejected(line, email[:320], reason, detail))


def _same_as(first_line: int) -> Text:
    return N_("same address as line %(line)s", line=str(first_line))


@dataclass
class _Columns:
    email: int
    name: int | None
    attributes: list[tuple[int, str]]


def _decoded_lines(stream: Iterable[bytes]) -> Iterator[str]:
    """The file's lines as text; a line that is not UTF-8 stops the import with its number
    (the caller's transaction then rolls back: nothing half-imported)."""
    for number, raw in enumerate(stream, 1):
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Invalid(N_(
                "line %(line)s is not valid UTF-8 (byte %(byte)s at position %(position)s). "
                "Save the file as “CSV UTF-8” and import it again; nothing was imported.",
                line=str(number), byte=f"0x{raw[exc.start]:02X}", position=exc.start + 1),
                fields={"file": N_("line %(line)s: not UTF-8", line=str(number))}) from None


def default_roles(header: list[str]) -> list[str]:
    """What each column is read as when nobody maps them: the first email-like header is
    the address, the first name-like one the name, every other named column an attribute."""
    names = [h.strip().lower() for h in header]
    email = next((i for i, h in enumerate(names) if h in EMAIL_HEADERS), None)
    name = next((i for i, h in enumerate(names) if h in NAME_HEADERS), None)
    return ["email" if i == email else "name" if i == name else
            "attribute" if names[i] else "skip" for i in range(len(header))]


def _mapped_columns(header: list[str], roles: list[str]) -> _Columns:
    """The columns as the marketer mapped them (one role per header column)."""
    if len(roles) != len(header) or any(r not in ROLES for r in roles):
        raise Invalid(N_("the column mapping does not fit the file's header; check the file "
                         "again"), fields={"mapping": N_("does not fit")})
    emails = [i for i, r in enumerate(roles) if r == "email"]
    names = [i for i, r in enumerate(roles) if r == "name"]
    if len(emails) != 1 or len(names) > 1:
        raise Invalid(N_("map exactly one column to the email address (and at most one to "
                         "the name)"), fields={"mapping": N_("one email column")})
    attributes = [(i, (header[i].strip() or f"column{i + 1}"))
                  for i, r in enumerate(roles) if r == "attribute"]
    _check_attribute_names(attributes)
    return _Columns(emails[0], names[0] if names else None, attributes)


#: A ``tracking`` column is the subscriber's consent to open and click tracking, not an
#: attribute; blank keeps what is stored.
TRACKING_HEADER = "tracking"
TRACKING_VALUES = {"yes": True, "true": True, "1": True, "y": True, "sí": True, "si": True,
                   "no": False, "false": False, "0": False, "n": False}


def _columns(header: list[str]) -> _Columns:
    names = [h.strip().lower() for h in header]
    email = next((i for i, h in enumerate(names) if h in EMAIL_HEADERS), None)
    if email is None:
        found = ", ".join(f"“{h.strip()}”" for h in header if h.strip()) or N_("nothing")
        raise Invalid(N_("the first line must be a header with an “email” column; found "
                         "%(found)s. Nothing was imported.", found=found),
                      fields={"file": N_("no email column")})
    name = next((i for i, h in enumerate(names) if h in NAME_HEADERS), None)
    attributes = [(i, header[i].strip()) for i in range(len(header))
                  if i not in (email, name) and header[i].strip()]
    _check_attribute_names(attributes)
    return _Columns(email, name, attributes)


def _check_attribute_names(attributes: list[tuple[int, str]]) -> None:
    """A header cell naming an attribute is within the attribute-name limit (it is not
    cut short: the file is refused, nothing imported)."""
    for i, key in attributes:
        if len(key) > text_limits.ATTRIBUTE_NAME:
            raise Invalid(N_("column %(column)s's name is longer than %(max)s characters (an "
                             "attribute name); nothing was imported.", column=str(i + 1),
                             max=str(text_limits.ATTRIBUTE_NAME)),
                          fields={"file": N_("column %(column)s", column=str(i + 1))})


def _delimiter(header_line: str) -> str:
    return ";" if header_line.count(";") > header_line.count(",") else ","


def _parse(row: list[str], columns: _Columns) -> SubscriberInput:
    """One data row as a subscriber, or :class:`Invalid` naming what is wrong with it."""
    def cell(index: int | None) -> str:
        return row[index].strip() if index is not None and index < len(row) else ""

    email = check_email(cell(columns.email))
    name = cell(columns.name)
    text_limits.check("name", name, text_limits.SUBSCRIBER_NAME)
    attributes = {key: cell(i) for i, key in columns.attributes
                  if cell(i) and key.lower() != TRACKING_HEADER}
    text_limits.check_attributes(attributes)
    tracking = next((cell(i) for i, key in columns.attributes
                     if key.lower() == TRACKING_HEADER), "")
    consent = TRACKING_VALUES.get(tracking.lower()) if tracking else None
    if tracking and consent is None:
        raise Invalid(N_("tracking must be yes or no (or true/false, 1/0), not “%(value)s”",
                         value=tracking[:40]), fields={"tracking": N_("invalid")})
    return SubscriberInput(email, name, attributes, consent)


_CLASSIFY = sa.text("""
SELECT i.n, s.line AS first_line,
       EXISTS (SELECT 1 FROM suppressions x WHERE x.email = i.email) AS suppressed
  FROM unnest(CAST(:emails AS text[])) WITH ORDINALITY AS i(email, n)
  LEFT JOIN import_seen s ON s.email = i.email
 ORDER BY i.n
""")


class _Importer:
    """Accumulates parsed lines into batches and writes each batch set-based."""

    def __init__(self, conn: Connection, list_id: int, *, dry_run: bool = False) -> None:
        self.conn = conn
        self.list_id = list_id
        self.dry_run = dry_run
        self.report = ImportReport(dry_run=dry_run)
        self.batch: dict[str, tuple[int, SubscriberInput]] = {}
        # Addresses already imported by this run (earlier batches), for duplicate reports;
        # a temporary table (a dry run's too: the file may hold millions of addresses).
        conn.execute(sa.text("CREATE TEMP TABLE import_seen (email text PRIMARY KEY, "
                             "line int NOT NULL) ON COMMIT DROP"))

    def add(self, line: int, subscriber: SubscriberInput) -> None:
        key = subscriber.email.lower()
        if key in self.batch:
            self.report.reject(line, subscriber.email, "duplicate",
                               _same_as(self.batch[key][0]))
            return
        self.batch[key] = (line, subscriber)
        if len(self.batch) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.batch:
            return
        items = list(self.batch.values())
        rows = self.conn.execute(_CLASSIFY, {"emails": list(self.batch)}).all()
        accepted: list[tuple[int, SubscriberInput]] = []
        for (line, sub), row in zip(items, rows, strict=True):
            if row.first_line is not None:
                self.report.reject(line, sub.email, "duplicate", _same_as(row.first_line))
            elif row.suppressed:
                self.report.reject(line, sub.email, "suppressed",
                                   N_("the address is on the suppression list"))
            else:
                accepted.append((line, sub))
        self.conn.execute(sa.text("""
            INSERT INTO import_seen (email, line)
            SELECT * FROM unnest(CAST(:emails AS text[]), CAST(:lines AS int[]))"""),
            {"emails": [s.email.lower() for _, s in accepted],
             "lines": [line for line, _ in accepted]})
        batch = [s for _, s in accepted]
        added, updated = would_upsert(self.conn, batch) if self.dry_run else \
            upsert_subscribers(self.conn, self.list_id, batch)
        self.report.added += added
        self.report.updated += updated
        self.batch = {}


def import_csv(conn: Connection, list_id: int, stream: Iterable[bytes], *,
               actor: str = "system", roles: list[str] | None = None,
               dry_run: bool = False) -> ImportReport:
    """Import a CSV file (an iterable of byte lines, e.g. an uploaded file) into the list.

    Lines with an invalid address, an address seen earlier in the file, or a suppressed
    address are rejected and reported; every other line is added or updates the subscriber
    with that address. A file that cannot be read as a whole (no header with an email column,
    bytes that are not UTF-8, a line the CSV reader refuses) raises :class:`Invalid` naming
    the line: the caller's transaction then rolls back and nothing is imported. ``roles``
    maps each header column to email/name/attribute/skip (default: by the header's names).
    Lines with more or fewer fields than the header are imported and counted in the
    report; a line whose quote is never closed, or whose address or name runs over lines, is
    rejected ("unclosed quote") and the lines after it are read on their own
    (:func:`_read_rows`).

    ``dry_run`` reports what the import would do without doing it: the same report, from
    read-only look-ups (:func:`webapp.domain.lists.would_upsert`); no subscriber, membership
    or audit row is written, not even one rolled back later. Its only write is the
    temporary table of addresses seen, dropped with the caller's transaction."""
    get_list(conn, list_id)
    lines = _decoded_lines(stream)
    header_line = next(lines, None)
    if header_line is None or not header_line.strip():
        raise Invalid(N_("the file is empty: the first line must be a header with an "
                         "“email” column"), fields={"file": N_("empty")})
    reader, source = _reader(header_line, lines)
    header = _header(reader)
    columns = _mapped_columns(header, roles) if roles is not None else _columns(header)
    importer = _Importer(conn, list_id, dry_run=dry_run)
    importer.report.header = [h.strip() for h in header]
    importer.report.roles = roles if roles is not None else default_roles(header)
    _read_rows(reader, source, columns, importer)
    importer.flush()
    report = importer.report
    report.rejected.sort(key=lambda r: r.line)  # batch checks report after per-line ones
    if dry_run:
        return report
    audit.record(conn, actor, "list.import", f"list:{list_id}", lines=report.lines,
                 added=report.added, updated=report.updated, rejected=dict(report.reasons))
    return report


def _header(reader: Any) -> list[str]:
    try:
        header: list[str] = next(reader)
    except csv.Error as exc:
        raise Invalid(N_("line %(line)s cannot be read as CSV (%(why)s); nothing was "
                         "imported.", line="1", why=str(exc)),
                      fields={"file": N_("line %(line)s", line="1")}) from None
    if len(header) > MAX_COLUMNS:
        raise Invalid(N_("the header has %(count)s columns; a file to import has at most "
                         "%(max)s", count=str(len(header)), max=str(MAX_COLUMNS)),
                      fields={"file": N_("too many columns")})
    return header


def header_size(stream: Iterable[bytes]) -> int:
    """How many columns the file's header has (what a column mapping must match)."""
    lines = _decoded_lines(stream)
    header_line = next(lines, None)
    if header_line is None:
        return 0
    return len(_header(csv.reader(_chain(header_line, lines),
                                  delimiter=_delimiter(header_line))))


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


class _Lines:
    """The file's lines as the CSV reader takes them, numbered, with the lines of the row
    being read kept so that they can be handed out again (:meth:`push_back`)."""

    def __init__(self, first: str, rest: Iterator[str]) -> None:
        self._rest = rest
        self._pending: deque[tuple[int, str]] = deque([(1, first)])
        self._fresh = 2
        self.taken: list[tuple[int, str]] = []

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        if self._pending:
            number, text = self._pending.popleft()
        else:
            text = next(self._rest)
            number, self._fresh = self._fresh, self._fresh + 1
        self.taken.append((number, text))
        return text

    def start_row(self) -> None:
        self.taken = []

    def push_back(self, lines: list[tuple[int, str]]) -> None:
        self._pending.extendleft(reversed(lines))


def _unclosed(lines: list[tuple[int, str]], delimiter: str) -> bool:
    """Whether these lines, read as one CSV record, end inside a quoted field."""
    try:
        list(csv.reader((text for _, text in lines), delimiter=delimiter, strict=True))
    except csv.Error as exc:
        return "unexpected end of data" in str(exc)
    return False


def _reader(header_line: str, lines: Iterator[str]) -> tuple[Any, _Lines]:
    source = _Lines(header_line, lines)
    return csv.reader(source, delimiter=_delimiter(header_line)), source


def _read_rows(reader: Any, source: _Lines, columns: _Columns, importer: _Importer) -> None:
    """Read the data rows. A quoted cell may run over several lines (an attribute with a
    line break), but an address or a name never does, and a quote must be closed: a row
    breaking either rule is refused at its first line, and the lines it swallowed are read
    again as rows of their own."""
    delimiter = reader.dialect.delimiter
    while True:
        source.start_row()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if len(source.taken) > 1:  # a quoted cell ran on until the field size limit
                _refuse_unclosed(source, columns, importer, delimiter)
                continue
            line = source.taken[0][0] if source.taken else reader.line_num + 1
            raise Invalid(N_("line %(line)s cannot be read as CSV (%(why)s); nothing was "
                             "imported.", line=str(line), why=str(exc)),
                          fields={"file": N_("line %(line)s", line=str(line))}) from None
        taken = source.taken
        if (len(taken) > 1 and any("\n" in c or "\r" in c for i, c in enumerate(row)
                                   if i in (columns.email, columns.name))) \
                or ((len(taken) > 1 or '"' in taken[0][1]) and _unclosed(taken, delimiter)):
            _refuse_unclosed(source, columns, importer, delimiter)
            continue
        if not any(cell.strip() for cell in row):
            continue
        line = taken[0][0]
        importer.report.lines += 1
        importer.report.shape(line, row)
        try:
            subscriber = _parse(row, columns)
        except Invalid as exc:
            raw = row[columns.email].strip() if columns.email < len(row) else ""
            reason = "invalid address" if "email" in exc.fields else "invalid line"
            importer.report.reject(line, raw, reason, exc.message)
            continue
        importer.add(line, subscriber)


def _refuse_unclosed(source: _Lines, columns: _Columns, importer: _Importer,
                     delimiter: str) -> None:
    """Refuse the row's first line and hand the lines it swallowed to the reader again."""
    (line, first), swallowed = source.taken[0], source.taken[1:]
    alone = next(csv.reader([first], delimiter=delimiter), [])
    raw = alone[columns.email].strip() if columns.email < len(alone) else ""
    importer.report.lines += 1
    importer.report.reject(line, raw, "unclosed quote", N_(
        "an unclosed quote? A quoted cell on this line runs on past the end of the "
        "line (an address or a name never spans lines, and a quote must be closed): "
        "this line was not imported; the lines after it were read on their own."))
    source.push_back(swallowed)
