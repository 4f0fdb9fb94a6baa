"""The bounce mailbox (``SENDDOCK_BOUNCE_MAILBOX``), polled by the workers (SPEC 12).

Each message is read, parsed (:mod:`workers.after_acceptance.reports`), matched to its
job (the VERP token in the address it was delivered to, else the original Message-ID) and
applied (:mod:`workers.after_acceptance.feedback`) in ONE database transaction that also
stores the message's digest in ``feedback_receipts``. Only after that commit is the
message moved to the Processed folder (IMAP; flagged ``\\Seen`` + ``$SendDockProcessed``
where the server cannot move) or deleted (POP3). So:

- never lost: a process that dies before the commit leaves the message where it was, and
  the next poll processes it;
- never reprocessed: a process that dies after the commit and before the move finds the
  digest on the next poll and only moves the message;
- mail that is no report (an auto-reply, spam) is moved too, recorded as ignored.

Only one process polls at a time (a transaction advisory lock), so two workers never
race on the same mailbox.
"""

from __future__ import annotations

import hashlib
import imaplib
import logging
import poplib
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import sqlalchemy as sa
from imap_tools import MailBox, MailBoxUnencrypted
from imap_tools.errors import MailboxFolderCreateError, MailboxMoveError
from sqlalchemy.engine import Engine

from workers.after_acceptance import feedback
from workers.after_acceptance.reports import MailReport, parse_report
from workers.building.links import job_from_bounce_address

log = logging.getLogger("senddock.mailbox")

PROCESSED_FLAG = "$SendDockProcessed"
_POLL_LOCK = 15_015  # advisory lock key (two-key form: (15015, 1)) for "one poller"


@dataclass(frozen=True)
class MailboxUrl:
    scheme: str
    host: str
    port: int
    user: str
    password: str
    folder: str

    def redacted(self) -> str:
        return f"{self.scheme}://{self.user}:***@{self.host}:{self.port}/{self.folder}"


def parse_mailbox_url(url: str) -> MailboxUrl:
    """``imaps://user:pass@host[:port]/FOLDER``, ``imap://…`` or ``pop3s://user:pass@host``
    (credentials percent-encoded). Raises ValueError naming the problem."""
    parts = urlsplit(url)
    defaults = {"imaps": 993, "imap": 143, "pop3s": 995}
    if parts.scheme not in defaults:
        raise ValueError("SENDDOCK_BOUNCE_MAILBOX must start with imaps://, imap:// or pop3s://")
    if not parts.hostname or not parts.username:
        raise ValueError("SENDDOCK_BOUNCE_MAILBOX needs user:password@host")
    folder = unquote(parts.path.lstrip("/")) or "INBOX"
    return MailboxUrl(parts.scheme, parts.hostname, parts.port or defaults[parts.scheme],
                      unquote(parts.username), unquote(parts.password or ""), folder)


@dataclass
class PollResult:
    seen: int = 0
    applied: int = 0
    duplicates: int = 0     # already processed by an earlier poll (only moved now)
    ignored: int = 0        # not a report
    unmatched: int = 0      # a report no job matched
    effects: dict[str, int] = field(default_factory=dict)


class BouncePoller:
    """Polls one bounce mailbox. ``poll_once()`` is what the pool runs on its schedule."""

    def __init__(self, engine: Engine, url: str, *, secret_key: str,
                 bounce_address: str | None, thresholds: feedback.Thresholds,
                 ca_file: str | None = None, processed_folder: str = "Processed",
                 timeout: float = 30) -> None:
        self.engine = engine
        self.url = parse_mailbox_url(url)
        self.secret_key = secret_key
        self.bounce_address = bounce_address
        self.thresholds = thresholds
        self.ca_file = ca_file
        self.processed_folder = processed_folder
        self.timeout = timeout

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    # --- one message ---------------------------------------------------------------------

    def _job_for(self, conn: Any, report: MailReport) -> int | None:
        verp = [j for j in (job_from_bounce_address(self.secret_key, a, self.bounce_address)
                            for a in report.addresses) if j is not None]
        ids = [report.original_message_id] if report.original_message_id else []
        return feedback.find_job(conn, verp_job_ids=verp, message_ids=ids)

    def process(self, raw: bytes, result: PollResult) -> None:
        """Apply one message, exactly once (its digest is the receipt), in one transaction.
        Raises only on database trouble (the message then stays to be polled again)."""
        digest = hashlib.sha256(raw).hexdigest()
        with self.engine.begin() as conn:
            first = conn.execute(sa.text("""
                INSERT INTO feedback_receipts (source, key) VALUES ('mailbox', :key)
                ON CONFLICT DO NOTHING RETURNING key"""), {"key": digest}).first()
            if first is None:
                result.duplicates += 1
                return
            report = parse_report(raw)
            if not report.events:
                result.ignored += 1
                return
            job_id = self._job_for(conn, report)
            for event in report.events:
                if job_id is None:
                    outcome = feedback.record_unmatched(conn, "mailbox", event, raw)
                    result.unmatched += 1
                else:
                    outcome = feedback.apply_event(conn, "mailbox", event, job_id, raw,
                                                   self.thresholds)
                    result.applied += 1
                result.effects[outcome.effect] = result.effects.get(outcome.effect, 0) + 1

    # --- polling ---------------------------------------------------------------------------

    def poll_once(self) -> PollResult | None:
        """Process every message waiting in the mailbox. None when another process is
        polling right now."""
        with self.engine.connect() as lock_conn:
            got = lock_conn.execute(sa.text("SELECT pg_try_advisory_lock(:a, 1)"),
                                    {"a": _POLL_LOCK}).scalar()
            if not got:
                return None
            try:
                return self._poll_pop3() if self.url.scheme == "pop3s" else self._poll_imap()
            finally:
                lock_conn.execute(sa.text("SELECT pg_advisory_unlock(:a, 1)"),
                                  {"a": _POLL_LOCK})
                lock_conn.commit()

    def _imap(self) -> MailBox | MailBoxUnencrypted:
        if self.url.scheme == "imaps":
            return MailBox(self.url.host, self.url.port, timeout=self.timeout,
                           ssl_context=self._ssl())
        return MailBoxUnencrypted(self.url.host, self.url.port, timeout=self.timeout)

    def _poll_imap(self) -> PollResult:
        result = PollResult()
        with self._imap().login(self.url.user, self.url.password,
                                initial_folder=self.url.folder) as box:
            can_move = self._ensure_folder(box)
            # Messages flagged (where moving failed) are done; everything else is read, in
            # UID order, exactly as the server stores it (BODY.PEEK: \Seen untouched).
            for uid in box.uids(f"UNKEYWORD {PROCESSED_FLAG}"):
                typ, data = box.client.uid("FETCH", uid, "(BODY.PEEK[])")
                raw = next((item[1] for item in data or [] if isinstance(item, tuple)
                            and len(item) > 1 and isinstance(item[1], bytes)), None)
                if typ != "OK" or raw is None:
                    log.warning("bounce mailbox: could not fetch message %s", uid)
                    continue
                result.seen += 1
                self.process(raw, result)
                self._done_imap(box, uid, can_move)
        return result

    def _ensure_folder(self, box: MailBox | MailBoxUnencrypted) -> bool:
        try:
            if not box.folder.exists(self.processed_folder):
                box.folder.create(self.processed_folder)
            return True
        except (MailboxFolderCreateError, imaplib.IMAP4.error) as exc:
            log.warning("bounce mailbox: cannot use folder %r (%s); flagging instead",
                        self.processed_folder, exc)
            return False

    def _done_imap(self, box: MailBox | MailBoxUnencrypted, uid: str | None,
                   can_move: bool) -> None:
        if uid is None:
            return
        if can_move:
            try:
                box.move(uid, self.processed_folder)
                return
            except (MailboxMoveError, imaplib.IMAP4.error) as exc:
                log.warning("bounce mailbox: move failed (%s); flagging instead", exc)
        box.flag(uid, ["\\Seen", PROCESSED_FLAG], True)

    def _poll_pop3(self) -> PollResult:
        result = PollResult()
        client = poplib.POP3_SSL(self.url.host, self.url.port, context=self._ssl(),
                                 timeout=self.timeout)
        try:
            client.user(self.url.user)
            client.pass_(self.url.password)
            count, _size = client.stat()
            for number in range(1, count + 1):
                _resp, lines, _octets = client.retr(number)
                result.seen += 1
                self.process(b"\r\n".join(lines) + b"\r\n", result)
                client.dele(number)  # only after the commit; applied at QUIT
            client.quit()
        except BaseException:
            # Without QUIT the server keeps every message (RFC 1939): they come back next
            # time, and their receipts make them duplicates.
            client.close()
            raise
        return result


def iter_reports(raw_messages: Iterator[bytes]) -> Iterator[MailReport]:
    """Parse messages (for the CLI's dry run and tests)."""
    for raw in raw_messages:
        yield parse_report(raw)
