"""Mail submitted by SMTP (docs/smtp.md, RFC 6409): who may submit, and the durable
acceptance of one message.

:func:`accept` runs in one transaction: the raw message is stored once
(``smtp_messages``), one job per recipient is enqueued by the same pipeline as
``POST /api/v1/messages`` (:func:`enqueue_transactional`, the one call into it), and only
when that transaction has committed does the server answer the final 250. A crash
before the commit leaves nothing (the client still holds the message and retries); after
it, the jobs are in PostgreSQL.

The transactional model is the API's: the kind comes from ``X-SendDock-Kind`` or the
token's ``default_kind``; ``X-SendDock-User`` is the job's user (else the recipient's
address); a resend of the same Message-ID with the same token is answered by the jobs it
created (an idempotency key per token, Message-ID and recipient), so a client that lost
the 250 and sends again does not send twice; suppressed recipients are held, the backlog
limit refuses with a temporary error.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from webapp.access import ENDPOINTS
from webapp.domain import kinds, messages, users
from webapp.domain.errors import DomainError, NotFound, Overloaded, TooMany
from webapp.domain.intake import Ask
from workers.building import submitted
from workers.core.addresses import domain_of
from workers.core.i18n import N_
from workers.core.settings import Config

# Who may submit: the roles that may call POST /api/v1/messages.
SUBMIT_ROLES = ENDPOINTS["api.create_message"]
MAX_USER_REF = 200
MAX_REPLY_LINE = 510  # RFC 5321 4.5.3.1.5: 512 octets with the CRLF


def enqueue_transactional(conn: Connection, config: Config, ask: Ask, *,
                          actor: str) -> tuple[dict[str, Any], str]:
    """Enqueue one transactional message exactly as ``POST /api/v1/messages`` does: the
    one call from SMTP submission into the enqueue path. Returns (job, why_existing)."""
    return messages.request(conn, config, ask, actor=actor)


@dataclass(frozen=True)
class Submitter:
    """An authenticated SMTP client: the API token's user."""

    user_id: int
    email: str
    role: str
    token_id: int
    token_name: str
    default_kind: str | None

    @property
    def actor(self) -> str:
        return f"{self.email} (token {self.token_id}, SMTP)"


class Refused(Exception):
    """The SMTP reply that refuses a command or a message (``reply``: code, enhanced code
    and text, e.g. ``452 4.3.1 ...``)."""

    def __init__(self, reply: str) -> None:
        super().__init__(reply)
        self.reply = reply


def authenticate(conn: Connection, password: str) -> Submitter:
    """The token's user when the token is live and its role may send transactional mail;
    else :class:`Refused` with the 535 to answer. The user name is not checked (clients
    insist on one: any text, or the token owner's email, will do)."""
    user = users.user_for_token(conn, password.strip()) if password.strip() else None
    if user is None:
        raise Refused("535 5.7.8 Authentication credentials invalid: the password must be "
                      "a live SendDock API token")
    if user["role"] not in SUBMIT_ROLES:
        raise Refused(f"535 5.7.8 This token's user has the role {user['role']}, which may "
                      f"not send transactional mail ({', '.join(sorted(SUBMIT_ROLES))} may)")
    row = conn.execute(sa.text("SELECT name, default_kind FROM api_tokens WHERE id = :id"),
                       {"id": user["token_id"]}).one()
    return Submitter(int(user["id"]), str(user["email"]), str(user["role"]),
                     int(user["token_id"]), str(row.name), row.default_kind)


AUTH_FAILURES = 10  # failed AUTH per client address, in all submission processes, ...
AUTH_WINDOW_MINUTES = 15  # ... within this many minutes: the address is locked out
_AUTH_LOCK = 0x5D28  # advisory lock namespace: one client address's failure count


def authenticate_client(conn: Connection, password: str, client: str
                        ) -> Submitter | Refused:
    """:func:`authenticate`, locked out per client address across processes: after
    :data:`AUTH_FAILURES` failures within :data:`AUTH_WINDOW_MINUTES` the answer is 454
    without checking the token. A failure is recorded in ``conn``'s transaction (so the
    refusal is returned, not raised: the caller commits). Under an advisory lock per
    address, so simultaneous guesses from several processes are counted one by one."""
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:ns, hashtext(:c))"),
                 {"ns": _AUTH_LOCK, "c": client})
    window = {"c": client, "w": AUTH_WINDOW_MINUTES}
    failures = conn.execute(sa.text(
        "SELECT count(*) FROM smtp_auth_failures WHERE client = :c "
        "AND at > now() - make_interval(mins => :w)"), window).scalar_one()
    if failures >= AUTH_FAILURES:
        return Refused(f"454 4.7.0 Too many failed AUTH attempts from your address; try "
                       f"again in {AUTH_WINDOW_MINUTES} minutes")
    try:
        return authenticate(conn, password)
    except Refused as refused:
        conn.execute(sa.text("DELETE FROM smtp_auth_failures "
                             "WHERE at <= now() - make_interval(mins => :w)"), window)
        conn.execute(sa.text("INSERT INTO smtp_auth_failures (client) VALUES (:c)"), window)
        return refused


def add_reply_counts(conn: Connection, counts: dict[tuple[str, str], int]) -> None:
    """Add replies counted by a submission process ({(outcome, code): n}) to the
    cumulative counters /metrics reports (``senddock_smtp_replies_total``)."""
    conn.execute(sa.text("""
        INSERT INTO smtp_reply_counts (outcome, code, n) VALUES (:o, :c, :n)
        ON CONFLICT (outcome, code) DO UPDATE SET n = smtp_reply_counts.n + excluded.n"""),
        [{"o": o, "c": c, "n": n} for (o, c), n in sorted(counts.items())])


def reply_counts(conn: Connection) -> dict[tuple[str, str], int]:
    return {(r.outcome, r.code): int(r.n) for r in conn.execute(sa.text(
        "SELECT outcome, code, n FROM smtp_reply_counts ORDER BY 1, 2"))}


def headers(conn: Connection, message_id: int) -> dict[str, Any]:
    """A stored message's facts and its header block as text (read from the first
    :data:`HEAD_LIMIT` bytes only), for the admins' headers page."""
    row = conn.execute(sa.text("""
        SELECT m.id, m.created_at, m.client, m.mail_from, m.size, t.name AS token_name,
               substring(m.raw FROM 1 FOR :limit) AS start
          FROM smtp_messages m LEFT JOIN api_tokens t ON t.id = m.token_id
         WHERE m.id = :id"""), {"id": message_id, "limit": HEAD_LIMIT}).mappings().first()
    if row is None:
        raise NotFound(N_("submitted message %(id)s is no longer stored", id=str(message_id)))
    found = dict(row)
    found["headers"] = submitted.head_of(bytes(found.pop("start"))).decode("utf-8",
                                                                           "replace")
    return found


def set_default_kind(conn: Connection, token_id: int, kind: str | None) -> None:
    """The kind of mail this token submits when a message does not name one."""
    if kind is not None:
        kinds.get(conn, kind)
    conn.execute(sa.text("UPDATE api_tokens SET default_kind = :k WHERE id = :id"),
                 {"k": kind, "id": token_id})


def sending_domains(conn: Connection) -> list[str]:
    return list(conn.execute(sa.text("SELECT domain FROM sending_domains ORDER BY domain"))
                .scalars())


def from_domain(raw: bytes) -> str:
    """The domain of the message's From address; :class:`Refused` when there is none."""
    address = submitted.from_address(raw)
    if not address or "@" not in address:
        raise Refused("550 5.6.0 The message has no From address; add a From header")
    return domain_of(address)


def refuse_domain(conn: Connection, domain: str) -> Refused:
    """The refusal of a From domain that is not one of the sending domains (it names them)."""
    return Refused(f"550 5.7.1 SendDock does not send for {domain}; it sends for: "
                   f"{', '.join(sending_domains(conn))}")


# When sending domains are configured, the From domain must be one of them: checked by the
# statement that stores the message, so the check costs no round trip of its own.
_SENDS_FOR = """(NOT EXISTS (SELECT 1 FROM sending_domains)
                 OR EXISTS (SELECT 1 FROM sending_domains WHERE domain = :domain))"""


def _kind_name(raw: bytes, submitter: Submitter) -> str:
    named = submitted.header_values(raw, "X-SendDock-Kind")
    name = named[0].strip() if named else (submitter.default_kind or "")
    if not name:
        raise Refused("550 5.6.0 No kind: add an X-SendDock-Kind header or give the token "
                      "a default kind (docs/smtp.md)")
    return name


def _user_ref(raw: bytes, recipient: str) -> str:
    named = submitted.header_values(raw, "X-SendDock-User")
    user = named[0].strip() if named else ""
    if len(user) > MAX_USER_REF or any(ord(c) < 32 for c in user):
        raise Refused(f"550 5.6.0 X-SendDock-User must be at most {MAX_USER_REF} characters "
                      "without control characters")
    return user or recipient.lower()


def idempotency_key(token_id: int, message_id: str, recipient: str) -> str | None:
    """One key per token, Message-ID and recipient (None: the message has no Message-ID)."""
    if not message_id:
        return None
    digest = hashlib.sha256(f"{token_id}\0{message_id}\0{recipient.lower()}".encode())
    return "smtp:" + digest.hexdigest()[:40]


def _refusal(exc: DomainError) -> Refused:
    text = str(exc.message)
    if isinstance(exc, Overloaded):
        return Refused(f"452 4.3.1 Insufficient system storage: {text}")
    if isinstance(exc, TooMany):
        return Refused(f"450 4.7.1 {text}")
    if isinstance(exc, NotFound):
        return Refused(f"550 5.6.0 {text}")
    if exc.status == 409:
        return Refused(f"451 4.7.0 {text}")
    return Refused(f"554 5.6.0 {text}")


HEAD_LIMIT = 1 << 20  # the header block read from a spooled message, at most
CHUNK = 1 << 20  # bytes of the message per write to PostgreSQL


def read_head(body: IO[bytes]) -> bytes:
    """The header block of a spooled message (at most :data:`HEAD_LIMIT` bytes); the file is
    left at its start."""
    body.seek(0)
    head = b""
    while len(head) < HEAD_LIMIT and (chunk := body.read(64 * 1024)):
        head += chunk
        if b"\r\n\r\n" in head or b"\n\n" in head:
            break
    body.seek(0)
    return submitted.head_of(head)


def _copy_text(value: str) -> str:
    """``value`` as a field of COPY's text format."""
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def store(conn: Connection, submitter: Submitter, *, message_id: str, mail_from: str,
          client: str, body: IO[bytes], domain: str) -> int:
    """Store a message once (``smtp_messages``) in ``conn``'s transaction, when SendDock
    sends for ``domain`` (its From domain; else :class:`Refused`). One larger than
    :data:`CHUNK` is streamed from ``body`` in :data:`CHUNK` pieces through COPY, so it is
    never in memory whole (docs/design.md §28); a smaller one is one INSERT."""
    size = body.seek(0, 2)
    body.seek(0)
    if size <= CHUNK:
        stored = conn.execute(sa.text(f"""
            INSERT INTO smtp_messages (token_id, message_id, mail_from, client, size, raw)
            SELECT :t, :m, :f, :c, :s, :raw WHERE {_SENDS_FOR} RETURNING id"""), {
            "t": submitter.token_id, "m": message_id, "f": mail_from, "c": client,
            "s": size, "raw": body.read(), "domain": domain}).scalar()
        if stored is None:
            raise refuse_domain(conn, domain)
        return int(stored)
    stored = conn.execute(sa.text(
        f"SELECT nextval(pg_get_serial_sequence('smtp_messages', 'id')) WHERE {_SENDS_FOR}"),
        {"domain": domain}).scalar()
    if stored is None:
        raise refuse_domain(conn, domain)
    fields = [str(stored), str(submitter.token_id), _copy_text(message_id),
              _copy_text(mail_from), _copy_text(client), str(size)]
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor, cursor.copy("COPY smtp_messages (id, token_id, message_id, mail_from, "
                             "client, size, raw) FROM STDIN") as copy:
        copy.write("\t".join(fields) + "\t\\\\x")
        while chunk := body.read(CHUNK):
            copy.write(chunk.hex())
        copy.write("\n")
    return int(stored)


@dataclass(frozen=True)
class Accepted:
    """What the final 250 reports: one correlation id per recipient, and whether every
    job already existed (a resend)."""

    correlation_ids: list[str]
    job_ids: list[int]
    existing: bool

    @property
    def reply(self) -> str:
        again = " (already accepted)" if self.existing else ""
        line = f"250 2.0.0 Queued{again} as {' '.join(self.correlation_ids)}"
        if len(line) <= MAX_REPLY_LINE:
            return line
        first, more = self.correlation_ids[0], len(self.correlation_ids) - 1
        return f"250 2.0.0 Queued{again} as {first} and {more} more, one per recipient"


def accept(engine: Engine, config: Config, submitter: Submitter, *, mail_from: str,
           recipients: list[str], body: IO[bytes], client: str) -> Accepted:
    """Store the message (read from ``body``, a file at any position) and enqueue one job
    per recipient, committed before it returns; :class:`Refused` (nothing stored)
    otherwise. Only the header block is read into memory."""
    raw = read_head(body)
    domain = from_domain(raw)
    with engine.begin() as conn:
        try:
            spec = kinds.active(conn, _kind_name(raw, submitter))
        except DomainError as exc:
            raise _refusal(exc) from None
        if kinds.policy(spec).verify_url:
            raise Refused(f"550 5.6.0 Kind {spec.name} needs a verify_url: send it through "
                          "POST /api/v1/verifications")
        message_ids = submitted.header_values(raw, "Message-ID")
        message_id = message_ids[0] if message_ids else ""
        stored = store(conn, submitter, message_id=message_id, mail_from=mail_from,
                       client=client, body=body, domain=domain)
        data = {"smtp_message_id": stored,
                "smtp_signature": submitted.signature(config.secret_key, stored),
                "source": {"via": "smtp", "client": client, "token": submitter.token_name,
                           "token_id": submitter.token_id, "message_id": message_id}}
        correlation_ids: list[str] = []
        job_ids: list[int] = []
        new = 0
        for recipient in recipients:
            ask = Ask(spec, _user_ref(raw, recipient), recipient, data,
                      key=idempotency_key(submitter.token_id, message_id, recipient))
            try:
                job, why = enqueue_transactional(conn, config, ask, actor=submitter.actor)
            except DomainError as exc:
                raise _refusal(exc) from None
            correlation_ids.append(str(job["correlation_id"]))
            job_ids.append(int(job["id"]))
            new += not why
        if not new:  # a resend: its jobs point at the first copy
            conn.execute(sa.text("DELETE FROM smtp_messages WHERE id = :id"), {"id": stored})
    return Accepted(correlation_ids, job_ids, existing=not new)
