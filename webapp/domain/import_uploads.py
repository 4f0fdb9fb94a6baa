"""A CSV file checked first (the import's dry run and column mapping) waits in PostgreSQL
until it is imported, so the confirming request may reach any web process behind a load
balancer. A kept file expires after :data:`KEEP_SECONDS`; expired files are deleted
whenever a file is kept or asked for. A user keeps at most one file per list (a unique
index): checking another replaces it, and it is deleted once imported, when the user starts
over, and when it cannot be read (docs/design.md §35). Deleting chunks leaves dead rows
behind; :func:`reclaim` vacuums the chunk table so the next file reuses their space."""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

KEEP_SECONDS = 3600
CHUNK = 1 << 20  # bytes per row of import_upload_chunks


@dataclass(frozen=True)
class KeptUpload:
    token: str
    list_id: int
    owner_id: int
    filename: str
    size: int


def forget_expired(conn: Connection) -> int:
    """Delete the kept files past their expiry (their chunks go with them)."""
    return conn.execute(sa.text(
        "DELETE FROM import_uploads WHERE expires_at <= now()")).rowcount


def forget(conn: Connection, owner_id: int, list_id: int) -> int:
    """Delete the file ``owner_id`` keeps for ``list_id`` (its chunks go with it); 0 or 1.
    Other users' files, and this user's for other lists, stay."""
    return conn.execute(sa.text(
        "DELETE FROM import_uploads WHERE owner_id = :o AND list_id = :l"),
        {"o": owner_id, "l": list_id}).rowcount


def keep(conn: Connection, owner_id: int, list_id: int, filename: str,
         stream: IO[bytes]) -> KeptUpload:
    """Store the upload (read in chunks, never whole) for :data:`KEEP_SECONDS`, in place of
    any file ``owner_id`` kept for ``list_id``; returns the token that names it. Committed
    with the caller's transaction. (Call :func:`forget` and :func:`reclaim` first, in
    transactions of their own, for the new file to reuse the old one's space.)"""
    forget_expired(conn)
    # Two checks by one user on one list at once: the second waits for the first, then
    # replaces it (instead of failing on the unique index).
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                 {"k": f"import_upload:{owner_id}:{list_id}"})
    forget(conn, owner_id, list_id)
    token = secrets.token_urlsafe(18)
    conn.execute(sa.text("""
        INSERT INTO import_uploads (token, owner_id, list_id, filename, expires_at)
        VALUES (:t, :o, :l, :f, now() + make_interval(secs => :keep))"""),
        {"t": token, "o": owner_id, "l": list_id, "f": filename[:255], "keep": KEEP_SECONDS})
    size = seq = 0
    while chunk := stream.read(CHUNK):
        conn.execute(sa.text("INSERT INTO import_upload_chunks (token, seq, data) "
                             "VALUES (:t, :s, :d)"), {"t": token, "s": seq, "d": chunk})
        size, seq = size + len(chunk), seq + 1
    conn.execute(sa.text("UPDATE import_uploads SET size = :n WHERE token = :t"),
                 {"n": size, "t": token})
    return KeptUpload(token, list_id, owner_id, filename[:255], size)


def kept(conn: Connection, token: str, owner_id: int, list_id: int) -> KeptUpload | None:
    """The file ``owner_id`` kept under ``token`` for ``list_id``; None once it expired, was
    imported or replaced (or for a token that never named one, or names another user's)."""
    forget_expired(conn)
    row = conn.execute(sa.text("""
        SELECT token, list_id, owner_id, filename, size FROM import_uploads
         WHERE token = :t AND owner_id = :o AND list_id = :l AND expires_at > now()"""),
        {"t": token, "o": owner_id, "l": list_id}).first()
    return KeptUpload(row.token, row.list_id, row.owner_id, row.filename, row.size) \
        if row else None


def lines(conn: Connection, token: str) -> Iterator[bytes]:
    """The kept file's byte lines, read a chunk at a time on ``conn``."""
    return iter(io.BufferedReader(_Chunks(conn, token), buffer_size=CHUNK))


def drop(conn: Connection, token: str) -> None:
    conn.execute(sa.text("DELETE FROM import_uploads WHERE token = :t"), {"t": token})


def reclaim(engine: Engine) -> None:
    """Vacuum the chunk table (and its TOAST table, where the bytes are) after chunks were
    deleted and committed, so that the next kept file reuses their space instead of growing
    the database by a file's size each time. VACUUM runs outside a transaction, on a
    connection of its own; SKIP_LOCKED: when another request is vacuuming it already, this
    one does not wait. Plain VACUUM (no table lock) gives the space back to PostgreSQL, not
    to the operating system, except for empty pages at the table's end."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (SKIP_LOCKED) import_upload_chunks"))


class _Chunks(io.RawIOBase):
    """The chunks of one kept file as a readable stream."""

    def __init__(self, conn: Connection, token: str) -> None:
        self.conn, self.token, self.seq, self.pending = conn, token, 0, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if not self.pending:
            data = self.conn.execute(sa.text(
                "SELECT data FROM import_upload_chunks WHERE token = :t AND seq = :s"),
                {"t": self.token, "s": self.seq}).scalar()
            if data is None:
                return 0
            self.pending, self.seq = bytes(data), self.seq + 1
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n
