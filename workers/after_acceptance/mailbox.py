"""The bounce mailbox (``SENDDOCK_BOUNCE_MAILBOX``), polled by the workers (docs/design.md §18).

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
- mail that is no report (an auto-reply, spam) is moved too, recorded as ignored;
- mail the reader cannot understand (``kind='unreadable'``), or whose processing fails for
  any reason other than the database being unavailable, is moved to the "could not read"
  folder (``SENDDOCK_BOUNCE_MAILBOX_UNREADABLE``) and listed, with the reason and its
  source, in ``mailbox_unreadable`` (Queue health shows it). One bad message never stops
  the poll: the next message is read either way. Only database trouble ends a poll (the
  message then stays where it is, to be read again).

Only one process polls at a time (a transaction advisory lock), so two workers never
race on the same mailbox.
"""

from __future__ import annotations

import hashlib
import imaplib
import logging
import poplib
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import sqlalchemy as sa
from imap_tools import MailBox, MailBoxUnencrypted
from imap_tools.errors import MailboxFolderCreateError, MailboxMoveError
from sqlalchemy.engine import Engine

from workers.after_acceptance import bounce_rules, feedback
from workers.after_acceptance.reports import Feedback, MailReport, parse_report
from workers.building.links import job_from_bounce_address
from workers.core import pg

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
    unreadable: int = 0     # moved to the "could not read" folder
    effects: dict[str, int] = field(default_factory=dict)


class BouncePoller:
    """Polls one bounce mailbox. ``poll_once()`` is what the pool runs on its schedule."""

    lock_key = 1  # second key of the "one poller" advisory lock (the report mailbox: 2)

    def __init__(self, engine: Engine, url: str, *, secret_key: str,
                 bounce_address: str | None, thresholds: feedback.Thresholds,
                 ca_file: str | None = None, processed_folder: str = "Processed",
                 unreadable_folder: str = "Could not read", timeout: float = 30) -> None:
        self.engine = engine
        self.url = parse_mailbox_url(url)
        self.secret_key = secret_key
        self.bounce_address = bounce_address
        self.thresholds = thresholds
        self.ca_file = ca_file
        self.processed_folder = processed_folder
        self.unreadable_folder = unreadable_folder
        self.timeout = timeout

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)

    # --- one message ---------------------------------------------------------------------

    def _job_for(self, conn: Any, report: MailReport) -> int | None:
        verp = [j for j in (job_from_bounce_address(self.secret_key, a, self.bounce_address)
                            for a in report.addresses) if j is not None]
        ids = [report.original_message_id] if report.original_message_id else []
        return feedback.find_job(conn, verp_job_ids=verp, message_ids=ids)

    def process(self, raw: bytes, result: PollResult) -> str:
        """Apply one message, exactly once (its digest is the receipt), in one transaction.
        Returns where the message goes: ``processed`` or ``unreadable``. Raises only on
        database trouble or a bug (see :meth:`read_one`)."""
        digest = hashlib.sha256(raw).hexdigest()
        with self.engine.begin() as conn:
            first = conn.execute(sa.text("""
                INSERT INTO feedback_receipts (source, key) VALUES ('mailbox', :key)
                ON CONFLICT DO NOTHING RETURNING key"""), {"key": digest}).first()
            if first is None:
                result.duplicates += 1
                known = conn.execute(sa.text(
                    "SELECT 1 FROM mailbox_unreadable WHERE digest = :d"), {"d": digest}).first()
                return "unreadable" if known else "processed"
            report = parse_report(raw)
            if report.kind == "unreadable":
                self._record_unreadable(conn, digest, raw, report.subject, report.error)
                result.unreadable += 1
                return "unreadable"
            events = report.events + self._ruled(conn, report)
            if not events:
                result.ignored += 1
                return "processed"
            job_id = self._job_for(conn, report)
            for event in events:
                if job_id is None:
                    outcome = feedback.record_unmatched(conn, "mailbox", event, raw)
                    result.unmatched += 1
                else:
                    outcome = feedback.apply_event(conn, "mailbox", event, job_id, raw,
                                                   self.thresholds)
                    result.applied += 1
                result.effects[outcome.effect] = result.effects.get(outcome.effect, 0) + 1
        return "processed"

    @staticmethod
    def _ruled(conn: Any, report: MailReport) -> list[Feedback]:
        """What the reader set aside (auto-replies, delays, delivery notices) that an admin's
        bounce rule says is a bounce or a complaint (docs/design.md §36)."""
        found = []
        for failure in report.ignored:
            rule = bounce_rules.find(conn, failure.diagnostic or failure.label)
            event = rule and bounce_rules.from_ignored(failure, report.original_message_id,
                                                       rule)
            if event:
                found.append(event)
        return found

    def _record_unreadable(self, conn: Any, digest: str, raw: bytes, subject: str,
                           error: str) -> None:
        sender = ""
        for line in raw[:65536].decode("utf-8", "replace").splitlines():
            if not line.strip():
                break
            if line.lower().startswith("from:"):
                sender = line[5:].strip()
                break
        log.warning("bounce mailbox: could not read a message (%s); moved to %r", error,
                    self.unreadable_folder)
        feedback.record_unreadable(conn, digest, subject=subject, sender=sender, error=error,
                                   folder=self.unreadable_folder, raw=raw)

    def read_one(self, raw: bytes, result: PollResult) -> str:
        """:meth:`process`, and whatever goes wrong with this one message (other than the
        database being unavailable) sends it to the "could not read" folder, so the poll
        goes on with the next one."""
        try:
            return self.process(raw, result)
        except Exception as exc:
            if pg.classify(exc) is not None:
                raise  # the database: the message stays, to be read again
            log.exception("bounce mailbox: processing a message failed")
            error = f"processing failed: {type(exc).__name__}: {exc}"[:1000]
        digest = hashlib.sha256(raw).hexdigest()
        with self.engine.begin() as conn:
            conn.execute(sa.text("""
                INSERT INTO feedback_receipts (source, key) VALUES ('mailbox', :key)
                ON CONFLICT DO NOTHING"""), {"key": digest})
            self._record_unreadable(conn, digest, raw, "", error)
        result.unreadable += 1
        return "unreadable"

    # --- polling ---------------------------------------------------------------------------

    def poll_once(self) -> PollResult | None:
        """Process every message waiting in the mailbox. None when another process is
        polling right now."""
        with self.engine.connect() as lock_conn:
            got = lock_conn.execute(sa.text("SELECT pg_try_advisory_lock(:a, :b)"),
                                    {"a": _POLL_LOCK, "b": self.lock_key}).scalar()
            if not got:
                return None
            try:
                return self._poll_pop3() if self.url.scheme == "pop3s" else self._poll_imap()
            finally:
                lock_conn.execute(sa.text("SELECT pg_advisory_unlock(:a, :b)"),
                                  {"a": _POLL_LOCK, "b": self.lock_key})
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
                where = self.read_one(raw, result)
                self._done_imap(box, uid, can_move, where)
        return result

    def _ensure_folder(self, box: MailBox | MailBoxUnencrypted) -> bool:
        try:
            for folder in (self.processed_folder, self.unreadable_folder):
                if not box.folder.exists(folder):
                    box.folder.create(folder)
            return True
        except (MailboxFolderCreateError, imaplib.IMAP4.error) as exc:
            log.warning("bounce mailbox: cannot use folders %r, %r (%s); flagging instead",
                        self.processed_folder, self.unreadable_folder, exc)
            return False

    def _done_imap(self, box: MailBox | MailBoxUnencrypted, uid: str | None,
                   can_move: bool, where: str = "processed") -> None:
        if uid is None:
            return
        if can_move:
            try:
                box.move(uid, self.unreadable_folder if where == "unreadable"
                         else self.processed_folder)
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
                self.read_one(b"\r\n".join(lines) + b"\r\n", result)
                client.dele(number)  # only after the commit; applied at QUIT
            client.quit()
        except BaseException:
            # Without QUIT the server keeps every message (RFC 1939): they come back next
            # time, and their receipts make them duplicates.
            client.close()
            raise
        return result
