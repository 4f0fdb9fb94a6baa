"""The SMTP submission server (RFC 6409, docs/smtp.md), on aiosmtpd.

``senddock smtp`` runs it as a process of its own; ``senddock serve`` starts it too when
``SENDDOCK_SUBMISSION_LISTEN`` or ``SENDDOCK_SUBMISSION_TLS_LISTEN`` names an address.
One asyncio loop in a thread speaks SMTP; the durable acceptance of each message (one
transaction: the stored message and its jobs, :func:`webapp.domain.submissions.accept`)
runs in a small thread pool, and the final 250 is sent after its commit.

aiosmtpd is the SMTP server of the Python project's own test suite's lineage (it replaced
the standard library's ``smtpd``), kept by the aio-libs group, with STARTTLS, implicit TLS
(an SSL context on the listening socket), AUTH with a callback, SIZE, 8BITMIME and
SMTPUTF8: everything a submission server needs, nothing to write by hand on the wire.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword
from sqlalchemy.engine import Engine

from webapp.domain import submissions
from webapp.domain.errors import Invalid
from webapp.domain.lists import check_email
from webapp.sink import data_may_start
from workers.core.settings import SETTINGS, Config, ConfigError, _env

log = logging.getLogger("senddock.submission")

# Commands per connection (more: 421 and the connection closes): AUTH guessing and
# EHLO/NOOP loops end quickly; a client reusing its connection for many messages does not.
CALL_LIMITS = {"AUTH": 5, "EHLO": 10, "HELO": 10, "STARTTLS": 3, "NOOP": 100, "VRFY": 10,
               "EXPN": 10, "HELP": 10, "*": 100_000}


def _parse_listen(name: str, raw: str | None) -> tuple[str, int] | None:
    if not raw:
        return None
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"SENDDOCK_{name} must be host:port, e.g. 0.0.0.0:587, got {raw!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True)
class SubmissionSettings:
    listen: tuple[str, int] | None
    tls_listen: tuple[str, int] | None
    cert: str | None
    key: str | None
    plain_auth: bool
    max_size: int
    max_recipients: int
    rate_limit: int
    hostname: str
    timeout: float
    max_connections: int

    @property
    def enabled(self) -> bool:
        return self.listen is not None or self.tls_listen is not None

    @classmethod
    def load(cls, config: Config, overrides: dict[str, str] | None = None
             ) -> SubmissionSettings:
        """The SUBMISSION_* settings (``overrides`` keyed without the prefix, as for
        :func:`workers.core.settings.load`)."""
        overrides = overrides or {}

        def get(name: str) -> str | None:
            if name in overrides:
                return overrides[name]
            value = _env(name)
            return value if value is not None else next(
                s.default for s in SETTINGS if s.name == name)

        def number(name: str) -> int:
            raw = get(name) or "0"
            if not raw.isdigit():
                raise ConfigError(f"SENDDOCK_{name} must be a whole number, got {raw!r}")
            return int(raw)

        listen = _parse_listen("SUBMISSION_LISTEN", get("SUBMISSION_LISTEN"))
        tls_listen = _parse_listen("SUBMISSION_TLS_LISTEN", get("SUBMISSION_TLS_LISTEN"))
        cert, key = get("SUBMISSION_CERT"), get("SUBMISSION_KEY")
        plain = (get("SUBMISSION_PLAIN_AUTH") or "").lower() in {"1", "on", "true", "yes"}
        if plain and listen and not _loopback(listen[0]):
            raise ConfigError("SENDDOCK_SUBMISSION_PLAIN_AUTH allows AUTH without TLS on a "
                              "loopback address only (127.0.0.1, ::1), not "
                              f"{listen[0]}")
        if (listen or tls_listen) and not (cert and key):
            if tls_listen or not (plain and listen and _loopback(listen[0])):
                raise ConfigError("SENDDOCK_SUBMISSION_CERT and SENDDOCK_SUBMISSION_KEY are "
                                  "required: AUTH is only offered after TLS")
        hostname = get("SUBMISSION_HOSTNAME") or urlsplit(config.base_url).hostname \
            or "localhost"
        return cls(listen, tls_listen, cert, key, plain, number("SUBMISSION_MAX_SIZE"),
                   max(1, number("SUBMISSION_MAX_RECIPIENTS")),
                   number("SUBMISSION_RATE_LIMIT"), hostname,
                   float(max(5, number("SUBMISSION_TIMEOUT"))),
                   max(1, number("SUBMISSION_MAX_CONNECTIONS")))

    def tls_context(self) -> ssl.SSLContext | None:
        if not (self.cert and self.key):
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context


class _Window:
    """Events per key in a sliding window (in this process)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._events: dict[Any, deque[float]] = {}
        self._lock = threading.Lock()

    def count(self, key: Any) -> int:
        now = time.monotonic()
        with self._lock:
            events = self._events.get(key)
            if not events:
                return 0
            while events and events[0] <= now - self.seconds:
                events.popleft()
            return len(events)

    def add(self, key: Any) -> None:
        with self._lock:
            self._events.setdefault(key, deque()).append(time.monotonic())


class Handler:
    """aiosmtpd's handler: the checks of each command and the durable DATA."""

    def __init__(self, engine: Engine, config: Config, settings: SubmissionSettings,
                 executor: ThreadPoolExecutor) -> None:
        self.engine = engine
        self.config = config
        self.settings = settings
        self.executor = executor
        self.sent = _Window(60.0)
        self.counts: dict[tuple[str, str], int] = {}  # since start, for the log
        self.unsaved: dict[tuple[str, str], int] = {}  # not yet added to /metrics' counts
        self._counts_lock = threading.Lock()

    def note(self, outcome: str, reply: str) -> None:
        """Count a reply (outcome: session, accepted, refused, auth_failed, auth_locked; its
        code is the reply's first three characters), for the log and /metrics."""
        key = (outcome, reply[:3])
        with self._counts_lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            self.unsaved[key] = self.unsaved.get(key, 0) + 1

    def save_counts(self) -> None:
        """Add the replies counted since the last call to the database's counters."""
        with self._counts_lock:
            unsaved, self.unsaved = self.unsaved, {}
        if not unsaved:
            return
        try:
            with self.engine.begin() as conn:
                submissions.add_reply_counts(conn, unsaved)
        except Exception:  # the database is away: keep them for the next call
            log.warning("SMTP reply counts not saved; kept for the next try", exc_info=True)
            with self._counts_lock:
                for key, n in unsaved.items():
                    self.unsaved[key] = self.unsaved.get(key, 0) + n

    def authenticator(self, server: SMTP, session: Any, envelope: Any, mechanism: str,
                      auth_data: Any) -> AuthResult:
        client = session.peer[0] if session.peer else ""
        if not isinstance(auth_data, LoginPassword):
            return AuthResult(success=False, handled=False)
        password = auth_data.password.decode("utf-8", "replace")
        with self.engine.begin() as conn:
            submitter = submissions.authenticate_client(conn, password, client)
        if isinstance(submitter, submissions.Refused):
            self.note("auth_locked" if submitter.reply.startswith("454") else "auth_failed",
                      submitter.reply)
            return AuthResult(success=False, handled=False, message=submitter.reply)
        return AuthResult(success=True, auth_data=submitter)

    async def handle_MAIL(self, server: SMTP, session: Any, envelope: Any, address: str,
                          mail_options: list[str]) -> str:
        if address:
            try:
                check_email(address)
            except Invalid:
                self.note("refused", "553")
                return "553 5.1.7 The sender address is not a valid address"
        submitter = session.auth_data
        if self.settings.rate_limit and isinstance(submitter, submissions.Submitter) \
                and self.sent.count(submitter.token_id) >= self.settings.rate_limit:
            self.note("refused", "450")
            return (f"450 4.7.1 This token has sent {self.settings.rate_limit} messages in "
                    "the last minute (SENDDOCK_SUBMISSION_RATE_LIMIT); try again shortly")
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 2.1.0 OK"

    async def handle_RCPT(self, server: SMTP, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        if len(envelope.rcpt_tos) >= self.settings.max_recipients:
            self.note("refused", "452")
            return (f"452 4.5.3 Too many recipients: at most {self.settings.max_recipients} "
                    "per message; send the rest in another message")
        try:
            check_email(address)
        except Invalid as exc:
            self.note("refused", "553")
            return f"553 5.1.3 Not a valid recipient address: {exc.message}"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Any, envelope: Any) -> str:
        submitter = session.auth_data
        if not isinstance(submitter, submissions.Submitter):
            return "530 5.7.0 Authentication required"
        raw: IO[bytes] = envelope.spool
        client = session.peer[0] if session.peer else ""

        def work() -> str:
            try:
                accepted = submissions.accept(
                    self.engine, self.config, submitter, mail_from=envelope.mail_from or "",
                    recipients=list(envelope.rcpt_tos), body=raw, client=client)
            except submissions.Refused as exc:
                self.note("refused", exc.reply)
                return exc.reply
            except Exception:  # the database is away: the client keeps it and retries
                log.exception("submission from %s not stored", client)
                self.note("refused", "451")
                return "451 4.3.0 The message could not be stored; try again later"
            self.sent.add(submitter.token_id)
            self.note("accepted", accepted.reply)
            return accepted.reply

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, work)


COUNTS_EVERY = 5.0  # seconds between additions of the reply counts to the database
SPOOL_IN_MEMORY = 256 * 1024  # DATA larger than this is spooled to a temporary file
TOO_MANY_CONNECTIONS = b"421 4.7.0 Too many connections to this server; try again later\r\n"


class SubmissionProtocol(SMTP):
    """aiosmtpd's SMTP protocol with two changes (docs/design.md §28): a connection past
    ``SUBMISSION_MAX_CONNECTIONS`` is answered 421 and closed before anything is read, and
    DATA is written line by line to a spool (memory up to :data:`SPOOL_IN_MEMORY`, then a
    temporary file) instead of a list of lines joined at the end, so a 20 MB message is
    never held in memory; the handler's ``handle_DATA`` reads ``envelope.spool``."""

    def __init__(self, gate: Gate, *args: Any, **kwargs: Any) -> None:
        self.gate = gate
        self.counted = self.refused = False
        super().__init__(*args, **kwargs)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._original_transport is None and not self.counted:  # not STARTTLS's
            if not self.gate.enter():
                self.refused = True
                self.gate.handler.note("refused", "421")
                transport.write(TOO_MANY_CONNECTIONS)  # type: ignore[attr-defined]
                transport.close()
                return
            self.counted = True
            self.gate.handler.note("session", "220")
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        if self.refused:
            return
        if self.counted:
            self.counted = False
            self.gate.leave()
        super().connection_lost(error)

    def eof_received(self) -> bool | None:
        return False if self.refused else super().eof_received()

    async def smtp_DATA(self, arg: str) -> None:
        if not await data_may_start(self, arg):
            return
        assert self.envelope is not None
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
        try:
            refusal = await self._read_data(spool)
            if refusal:
                self._set_post_data_state()
                await self.push(refusal)
                return
            spool.seek(0)
            self.envelope.spool = spool  # type: ignore[attr-defined]
            status = await self._call_handler_hook("DATA")
        finally:
            spool.close()
        self._set_post_data_state()
        await self.push(status)

    async def _read_data(self, spool: IO[bytes]) -> str | None:
        """Read DATA up to the lone dot into ``spool`` (dot-unstuffed, RFC 5321 4.5.2); the
        reply refusing it (line or message too long) once it is read whole, else None."""
        size, limit, refusal = 0, self.data_size_limit, None
        in_line = False  # within a line longer than the stream's limit
        while True:
            if self.transport is None:  # the connection is gone: nothing to answer
                raise asyncio.CancelledError
            try:
                line = await self._reader.readuntil(b"\r\n")
            except asyncio.CancelledError:
                self._writer.close()
                raise
            except asyncio.LimitOverrunError as exc:
                line = await self._reader.read(exc.consumed)
                refusal = refusal or "500 Line too long (see RFC5321 4.5.3.1.6)"
            if not in_line and line == b".\r\n":
                break
            if not in_line and line.startswith(b"."):
                line = line[1:]
            in_line = not line.endswith(b"\r\n")
            size += len(line)
            if limit and size > limit:
                refusal = refusal or "552 5.3.4 Message too big for this server"
            if refusal is None:
                spool.write(line)
        return refusal


class Gate:
    """Open connections of one server (both ports), counted on its event loop."""

    def __init__(self, limit: int, handler: Handler) -> None:
        self.limit = limit
        self.handler = handler
        self.open = 0

    def enter(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


class SubmissionServer:
    """Both listeners on one asyncio loop in a thread of its own."""

    def __init__(self, engine: Engine, config: Config, settings: SubmissionSettings) -> None:
        self.settings = settings
        self.executor = ThreadPoolExecutor(max_workers=max(2, config.db_web_pool),
                                           thread_name_prefix="smtp-accept")
        self.handler = Handler(engine, config, settings, self.executor)
        self.gate = Gate(settings.max_connections, self.handler)
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.base_events.Server] = []
        self.ports: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._saver = threading.Thread(target=self._save_counts, name="smtp-counts",
                                       daemon=True)

    def _save_counts(self) -> None:
        while not self._stopping.wait(COUNTS_EVERY):
            self.handler.save_counts()

    def _factory(self, tls_context: ssl.SSLContext | None, require_tls: bool,
                 auth_require_tls: bool) -> Callable[[], SMTP]:
        def make() -> SMTP:
            with warnings.catch_warnings():
                # Implicit TLS: the socket is TLS already, which aiosmtpd's check for
                # "AUTH without TLS" cannot see; plain AUTH is loopback-only (load()).
                warnings.simplefilter("ignore", UserWarning)
                return self._smtp(tls_context, require_tls, auth_require_tls)
        return make

    def _smtp(self, tls_context: ssl.SSLContext | None, require_tls: bool,
              auth_require_tls: bool) -> SMTP:
        return SubmissionProtocol(
            self.gate, self.handler, data_size_limit=self.settings.max_size or None,
            enable_SMTPUTF8=True, decode_data=False, hostname=self.settings.hostname,
            ident="SendDock submission", tls_context=tls_context,
            require_starttls=require_tls, timeout=self.settings.timeout, auth_required=True,
            auth_require_tls=auth_require_tls, authenticator=self.handler.authenticator,
            command_call_limit=CALL_LIMITS, loop=self.loop)

    async def _listen(self) -> None:
        tls = self.settings.tls_context()
        if self.settings.listen is not None:
            host, port = self.settings.listen
            plain = self.settings.plain_auth and _loopback(host)
            server = await self.loop.create_server(
                self._factory(tls, require_tls=tls is not None and not plain,
                              auth_require_tls=not plain), host, port)
            self.servers.append(server)
            self.ports["starttls"] = server.sockets[0].getsockname()[1]
        if self.settings.tls_listen is not None:
            host, port = self.settings.tls_listen
            server = await self.loop.create_server(
                self._factory(None, require_tls=False, auth_require_tls=False), host, port,
                ssl=tls)
            self.servers.append(server)
            self.ports["tls"] = server.sockets[0].getsockname()[1]

    def start(self) -> SubmissionServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, name="smtp-submission", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        self._saver.start()
        log.info("SMTP submission listening: %s", self.ports)
        return self

    def stop(self) -> None:
        async def close() -> None:
            for server in self.servers:
                server.close()
                await server.wait_closed()

        if self._thread is not None and self.loop.is_running():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.executor.shutdown(wait=True)
        self._stopping.set()
        if self._saver.is_alive():
            self._saver.join(timeout=10)
        self.handler.save_counts()
        log.info("SMTP submission stopped; accepted and refused: %s", self.handler.counts)
