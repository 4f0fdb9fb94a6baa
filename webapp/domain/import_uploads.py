"""A CSV file checked first (the import's dry run and column mapping) waits in PostgreSQL
until it is imported, so the confirming request may reach any web process behind a load
balancer. A kept file expires after :data:`KEEP_SECONDS`; expired files are deleted
whenever a file is kept or asked for."""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import sqlalchemy as sa
from sqlalchemy.engine import Connection

KEEP_SECONDS = 3600
CHUNK = 1 << 20  # bytes per row of import_upload_chunks


@dataclass(frozen=True)
class KeptUpload:
    token: str
    list_id: int
    filename: str
    size: int


def forget_expired(conn: Connection) -> int:
    """Delete the kept files past their expiry (their chunks go with them)."""
    return conn.execute(sa.text(
        "DELETE FROM import_uploads WHERE expires_at <= now()")).rowcount


def keep(conn: Connection, list_id: int, filename: str, stream: IO[bytes]) -> KeptUpload:
    """Store the upload (read in chunks, never whole) for :data:`KEEP_SECONDS`; returns the
    token that names it. Committed with the caller's transaction."""
    forget_expired(conn)
    token = secrets.token_urlsafe(18)
    conn.execute(sa.text("""
        INSERT INTO import_uploads (token, list_id, filename, expires_at)
        VALUES (:t, :l, :f, now() + make_interval(secs => :keep))"""),
        {"t": token, "l": list_id, "f": filename[:255], "keep": KEEP_SECONDS})
    size = seq = 0
    while chunk := stream.read(CHUNK):
        conn.execute(sa.text("INSERT INTO import_upload_chunks (token, seq, data) "
                             "VALUES (:t, :s, :d)"), {"t": token, "s": seq, "d": chunk})
        size, seq = size + len(chunk), seq + 1
    conn.execute(sa.text("UPDATE import_uploads SET size = :n WHERE token = :t"),
                 {"n": size, "t": token})
    return KeptUpload(token, list_id, filename[:255], size)


def kept(conn: Connection, token: str, list_id: int) -> KeptUpload | None:
    """The file kept under ``token`` for ``list_id``; None once it expired or was
    imported (or for a token that never named one)."""
    forget_expired(conn)
    row = conn.execute(sa.text("""
        SELECT token, list_id, filename, size FROM import_uploads
         WHERE token = :t AND list_id = :l AND expires_at > now()"""),
        {"t": token, "l": list_id}).first()
    return KeptUpload(row.token, row.list_id, row.filename, row.size) if row else None


def lines(conn: Connection, token: str) -> Iterator[bytes]:
    """The kept file's byte lines, read a chunk at a time on ``conn``."""
    return iter(io.BufferedReader(_Chunks(conn, token), buffer_size=CHUNK))


def drop(conn: Connection, token: str) -> None:
    conn.execute(sa.text("DELETE FROM import_uploads WHERE token = :t"), {"t": token})


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
