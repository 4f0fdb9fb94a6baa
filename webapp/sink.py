"""``senddock smtp-sink``: a local SMTP server that records what it accepts.

Used by the tests, the demo and the benchmarks as a stand-in relay. Every
accepted message becomes one JSON line in the record file (``time``: when it
was accepted, ``started``: when its MAIL FROM arrived); every refused
attempt too, with a ``"rejected"`` key holding the reply, so readers can tell
them apart. Replies can be scripted per recipient with a rules file::

    {"rules": [
        {"match": "hard-*@example.com", "reply": "550 5.1.1 User unknown", "stage": "rcpt"},
        {"match": "soft-*@example.com", "reply": "451 4.3.0 Try later", "times": 2},
        {"match": "*", "reply": "421 4.7.0 Going down", "stage": "mail"}],
     "auth": {"username": "u", "password": "p"}}

``match`` is an fnmatch pattern against the lower-cased recipient (for stage
``mail``, where no recipient is known yet, against the lower-cased sender);
``stage`` is ``rcpt`` (default), ``data`` (refuse after the message was
received) or ``mail``; ``times: N`` gives the reply to the first N attempts
per address, then lets the next rule (or acceptance) answer. A 421 reply also
closes the connection, as a real relay does. With ``auth``, AUTH PLAIN/LOGIN
is required (without TLS) and wrong credentials get 535 5.7.8. With
``"delay": SECONDS`` every accepted message waits that long before its final
250 (a slow relay, so a test can catch a worker mid-send). The rules file is
re-read whenever its modification time or size changes.

With ``--keep DIR`` (``keep_dir=`` in :class:`SinkServer`) the sink also keeps each
accepted message whole, for ``senddock demo``'s mail viewer: ``DIR/<id>.eml`` holds the
raw bytes and ``DIR/<id>.json`` the envelope (time, sender, recipients, subject, size).
Only the newest ``--keep-last`` messages stay (older ones are deleted as new ones
arrive), so the folder is bounded however much the demo sends. Keeping is off by
default: the tests and benchmarks that use the sink write nothing but the record line.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import fnmatch
import json
import os
import re
import signal
import ssl
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from email.header import decode_header, make_header
from pathlib import Path
from typing import Any, TextIO

import click
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

STAGES = ("mail", "rcpt", "data")
SINK_HOSTNAME = "senddock-sink"
AUTH_REQUIRED = "530 5.7.0 Authentication required"
_SIMPLE_ADDRESS = re.compile(r"\s*<([^<>\s\"()\\,;:@]+@[^<>\s\"()\\,;:@]+)>(.*)", re.DOTALL)
_DATA_END = b"\r\n.\r\n"
_READ_CHUNK = 1 << 20


def _check_rules(rules: dict[str, Any]) -> dict[str, Any]:
    """Validate a rules document; raises ValueError naming the bad rule."""
    if not isinstance(rules, dict):
        raise ValueError("rules must be a JSON object")
    for index, rule in enumerate(rules.get("rules", [])):
        if not isinstance(rule, dict) or "match" not in rule or "reply" not in rule:
            raise ValueError(f"rule {index} needs 'match' and 'reply'")
        if rule.get("stage", "rcpt") not in STAGES:
            raise ValueError(f"rule {index}: stage must be one of {', '.join(STAGES)}")
        reply = str(rule["reply"])
        if len(reply) < 3 or not reply[:3].isdigit() or reply[0] not in "2345":
            raise ValueError(f"rule {index}: reply must start with a 3-digit SMTP code")
    delay = rules.get("delay", 0)
    if not isinstance(delay, int | float) or delay < 0:
        raise ValueError("delay must be a number of seconds >= 0")
    auth = rules.get("auth")
    if auth is not None and not (isinstance(auth, dict) and "username" in auth):
        raise ValueError("auth needs 'username' and 'password'")
    return rules


class Rules:
    """Scripted replies, from a dict or a file re-read when it changes."""

    def __init__(self, rules: dict[str, Any] | None = None, path: Path | None = None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._doc: dict[str, Any] = _check_rules(rules or {})
        self._attempts: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()
        self.refresh()

    def replace(self, rules: dict[str, Any]) -> None:
        """Swap in new rules (the attempt counts per address are kept)."""
        self._doc = _check_rules(rules)

    def refresh(self) -> None:
        """Re-read the rules file if it changed; a broken file keeps the old rules."""
        if self.path is None:
            return
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp == self._stamp:
                return
            self._doc = _check_rules(json.loads(self.path.read_text(encoding="utf-8")))
            self._stamp = stamp
        except (OSError, ValueError) as exc:
            print(f"smtp-sink: cannot use rules file {self.path}: {exc}", file=sys.stderr)

    @property
    def auth(self) -> dict[str, str] | None:
        auth = self._doc.get("auth")
        return auth if isinstance(auth, dict) else None

    @property
    def pipelining(self) -> bool:
        """Advertise PIPELINING (RFC 2920) like real relays do; rules may turn it off."""
        return bool(self._doc.get("pipelining", True))

    @property
    def delay(self) -> float:
        """Seconds to hold each accepted message before the final 250."""
        return float(self._doc.get("delay", 0))

    def reply_for(self, stage: str, address: str) -> str | None:
        """The scripted reply for ``address`` at ``stage``, or None to accept.

        Counts the attempt against a ``times`` rule when that rule answers.
        """
        address = address.lower()
        for rule in self._doc.get("rules", ()):
            if rule.get("stage", "rcpt") != stage or not fnmatch.fnmatchcase(
                address, str(rule["match"]).lower()
            ):
                continue
            times = rule.get("times")
            if times is None:
                return str(rule["reply"])
            key = (str(rule["match"]), str(rule["reply"]), address)
            with self._lock:
                seen = self._attempts.get(key, 0)
                if seen < int(times):
                    self._attempts[key] = seen + 1
                    return str(rule["reply"])
        return None


def _header(headers: bytes, name: bytes) -> str | None:
    """One header's unfolded, RFC 2047-decoded value from a raw header block."""
    lowered = headers.lower()
    start = 0 if lowered.startswith(name) else lowered.find(b"\n" + name)
    if start < 0:
        return None
    start = start + len(name) + (0 if start == 0 else 1)
    end = start
    while True:
        end = headers.find(b"\n", end)
        if end < 0 or headers[end + 1 : end + 2] not in (b" ", b"\t"):
            break
        end += 1
    raw = headers[start : end if end >= 0 else len(headers)]
    value = b" ".join(raw.split()).decode("utf-8", "replace")
    if "=?" in value:
        try:
            value = str(make_header(decode_header(value)))
        except (ValueError, LookupError):
            pass
    return value


KEEP_LAST = 1000  # messages kept whole by --keep (the demo's mail viewer)
_KEPT_NAME = re.compile(r"^(\d{1,12})\.json$")


class MailKeeper:
    """Keeps the newest ``last`` accepted messages whole in ``folder``.

    Each message is ``<id>.eml`` (raw bytes) plus ``<id>.json`` (envelope); ids grow from
    the highest one already there. The ``.json`` is written after the ``.eml`` and deleted
    before it, and half a JSON object never parses, so a reader that lists ``*.json`` and
    skips what does not parse never sees half a message (no temporary files and renames:
    two writes per message is all keeping costs the sink).
    """

    def __init__(self, folder: Path, last: int = KEEP_LAST) -> None:
        if last < 1:
            raise ValueError("keep at least one message")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.last = last
        self._ids: collections.deque[int] = collections.deque(kept_ids(self.folder))
        self._next = (self._ids[-1] + 1) if self._ids else 1
        self._lock = threading.Lock()
        self._prune()

    def keep(self, meta: dict[str, Any], content: bytes) -> int:
        with self._lock:
            message_id = self._next
            self._next += 1
            self._ids.append(message_id)
        stem = self.folder / f"{message_id:08d}"
        stem.with_suffix(".eml").write_bytes(content)
        stem.with_suffix(".json").write_bytes(
            json.dumps({"id": message_id, **meta}, ensure_ascii=False).encode())
        self._prune()
        return message_id

    def _prune(self) -> None:
        with self._lock:
            gone = [self._ids.popleft() for _ in range(max(0, len(self._ids) - self.last))]
        for old in gone:
            for suffix in (".json", ".eml"):
                try:
                    (self.folder / f"{old:08d}{suffix}").unlink()
                except FileNotFoundError:
                    pass


def kept_ids(folder: Path) -> list[int]:
    """The ids of the messages kept in ``folder``, oldest first."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(m[1]) for m in map(_KEPT_NAME.match, names) if m)


def kept_envelope(folder: Path, message_id: int) -> dict[str, Any] | None:
    """The envelope of one kept message, or None if it is not (or no longer) there."""
    try:
        meta = json.loads((Path(folder) / f"{message_id:08d}.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def kept_raw(folder: Path, message_id: int) -> bytes | None:
    """The raw bytes of one kept message, or None if it is not (or no longer) there."""
    try:
        return (Path(folder) / f"{message_id:08d}.eml").read_bytes()
    except OSError:
        return None


class Recorder:
    """Appends one JSON line per accepted or refused message, flushed at once."""

    def __init__(self, path: Path, echo: bool = False, keep_raw: bool = False,
                 keeper: MailKeeper | None = None) -> None:
        self.path = path
        self.echo = echo
        self.keep_raw = keep_raw
        self.keeper = keeper
        self.raw: list[bytes] = []  # the accepted messages' bytes, when keep_raw
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, ensure_ascii=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
        if self.echo:
            print(line, file=sys.stderr, flush=True)

    def accepted(self, envelope: Envelope) -> None:
        content = envelope.original_content or b""
        if self.keep_raw:
            with self._lock:
                self.raw.append(content)
        head = content.split(b"\r\n\r\n", 1)[0]
        entry = {
            "time": datetime.now(UTC).isoformat(),
            "started": getattr(envelope, "started", None),  # its MAIL FROM
            "mail_from": envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "message_id": _header(head, b"message-id:"),
            "subject": _header(head, b"subject:"),
            "size": len(content),
        }
        if self.keeper is not None:
            try:
                self.keeper.keep(entry, content)
            except OSError as exc:  # a full disk loses the copy, never the message
                print(f"smtp-sink: cannot keep a copy of the message: {exc}", file=sys.stderr)
        self.write(entry)

    def rejected(self, stage: str, mail_from: str | None, rcpt_tos: list[str], reply: str) -> None:
        self.write(
            {
                "time": datetime.now(UTC).isoformat(),
                "mail_from": mail_from,
                "rcpt_tos": rcpt_tos,
                "stage": stage,
                "rejected": reply,
            }
        )

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _close_after_421(server: SMTP, reply: str) -> None:
    if reply.startswith("421") and server.transport is not None:
        # Runs after the reply was written (the hook returns before the
        # loop gets control again); close() flushes it first.
        server.loop.call_soon(server.transport.close)


class SinkHandler:
    """aiosmtpd handler: scripted refusals, recording, optional AUTH."""

    def __init__(self, rules: Rules, recorder: Recorder) -> None:
        self.rules = rules
        self.recorder = recorder

    def authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
    ) -> AuthResult:
        self.rules.refresh()
        auth = self.rules.auth
        if auth is None:
            return AuthResult(success=True, auth_data=auth_data)
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == str(auth["username"]).encode()
            and auth_data.password == str(auth.get("password", "")).encode()
        )
        return AuthResult(success=ok, handled=False, auth_data=auth_data)

    async def handle_EHLO(self, server: SMTP, session: Session, envelope: Envelope,
                          hostname: str, responses: list[str]) -> list[str]:
        session.host_name = hostname
        self.rules.refresh()
        if self.rules.pipelining:
            responses.insert(len(responses) - 1, "250-PIPELINING")  # before "250 HELP"
        return responses

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        self.rules.refresh()
        if self.rules.auth is not None and not session.authenticated:
            self.recorder.rejected("mail", address, [], AUTH_REQUIRED)
            return AUTH_REQUIRED
        reply = self.rules.reply_for("mail", address)
        if reply is not None:
            self.recorder.rejected("mail", address, [], reply)
            _close_after_421(server, reply)
            return reply
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        envelope.started = datetime.now(UTC).isoformat()  # type: ignore[attr-defined]
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        reply = self.rules.reply_for("rcpt", address)
        if reply is not None:
            self.recorder.rejected("rcpt", envelope.mail_from, [address], reply)
            _close_after_421(server, reply)
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        for address in envelope.rcpt_tos:
            reply = self.rules.reply_for("data", address)
            if reply is not None:
                self.recorder.rejected("data", envelope.mail_from, list(envelope.rcpt_tos), reply)
                _close_after_421(server, reply)
                return reply
        if self.rules.delay:
            await asyncio.sleep(self.rules.delay)
        self.recorder.accepted(envelope)
        return "250 2.0.0 OK queued"


class _SinkSMTP(SMTP):
    """aiosmtpd's SMTP protocol with a bulk DATA reader and a fast address path.

    aiosmtpd reads DATA one line at a time and parses every address with the
    email package's header parser; both dominate its CPU per message. The sink
    keeps aiosmtpd's conversation and hooks but reads the message in large
    chunks, so one sink process keeps up with a whole worker pool. Live
    connections are tracked so stop() can drop them.
    """

    def __init__(self, handler: SinkHandler, connections: set[SMTP], **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._connections = connections
        connections.add(self)

    def connection_lost(self, error: Exception | None) -> None:
        self._connections.discard(self)
        super().connection_lost(error)

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        match = _SIMPLE_ADDRESS.match(arg)
        if match is None:
            return super()._getaddr(arg)
        return match[1], match[2]

    async def _read_message(self) -> bytes | None:
        """The DATA payload up to the lone dot, un-dot-stuffed; None if the peer left."""
        buf = bytearray(b"\r\n")  # lets an empty message's ".\r\n" match the terminator
        while True:
            try:
                chunk = await self._reader.read(_READ_CHUNK)
            except asyncio.CancelledError:
                self._writer.close()  # the client disconnected mid-DATA
                raise
            if not chunk:
                return None
            searched_from = max(0, len(buf) - 4)
            buf += chunk
            end = buf.find(_DATA_END, searched_from)
            if end >= 0:
                break
        if end + 5 < len(buf):
            # The client sent its next command without waiting for our reply.
            self._reader.feed_data(bytes(buf[end + 5 :]))
        return bytes(buf[: end + 2]).replace(b"\r\n..", b"\r\n.")[2:]

    async def smtp_DATA(self, arg: str) -> None:
        if not await data_may_start(self, arg):
            return
        content = await self._read_message()
        if content is None:
            return
        assert self.envelope is not None
        self.envelope.content = content
        self.envelope.original_content = content
        status = await self._call_handler_hook("DATA")
        self._set_post_data_state()
        await self.push(status)


async def data_may_start(smtp: SMTP, arg: str) -> bool:
    """aiosmtpd's checks before DATA (HELO, AUTH, a recipient, no argument), answered as it
    answers them, then the 354: for protocols that read DATA their own way."""
    if await smtp.check_helo_needed() or await smtp.check_auth_needed("DATA"):
        return False
    assert smtp.envelope is not None
    if not smtp.envelope.rcpt_tos:
        await smtp.push("503 Error: need RCPT command")
        return False
    if arg:
        await smtp.push("501 Syntax: DATA")
        return False
    await smtp.push("354 End data with <CR><LF>.<CR><LF>")
    return True


class _ServerState:
    """What one listening sink needs: handler, TLS, open connections."""

    def __init__(self, handler: SinkHandler, tls_context: ssl.SSLContext | None) -> None:
        self.handler = handler
        self.tls_context = tls_context
        self.sessions = 0
        self.connections: set[SMTP] = set()

    def factory(self) -> SMTP:
        """A fresh SMTP protocol per connection; counts sessions."""
        self.sessions += 1
        return _SinkSMTP(
            self.handler,
            self.connections,
            hostname=SINK_HOSTNAME,
            ident="SendDock smtp-sink",
            tls_context=self.tls_context,
            authenticator=self.handler.authenticate,
            auth_require_tls=False,
            enable_SMTPUTF8=True,
            data_size_limit=0,
            loop=asyncio.get_running_loop(),
        )

    def abort_connections(self) -> None:
        for smtp in list(self.connections):
            if isinstance(smtp.transport, asyncio.Transport):
                smtp.transport.abort()


class SinkServer:
    """An in-process sink on a background thread, for tests.

    ``start()`` binds (port 0 picks a free port) and returns the port;
    ``stop()`` closes the listener and drops open connections. With
    ``tls_context`` the sink offers STARTTLS, or speaks TLS from the first
    byte when ``implicit_tls`` is true.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        record_path: Path,
        rules: dict[str, Any] | None = None,
        rules_path: Path | None = None,
        tls_context: ssl.SSLContext | None = None,
        implicit_tls: bool = False,
        keep_raw: bool = False,
        keep_dir: Path | None = None,
        keep_last: int = KEEP_LAST,
    ) -> None:
        self.host = host
        self.keep_raw = keep_raw
        self.keep_dir = keep_dir
        self.keep_last = keep_last
        self.port = port
        self.record_path = Path(record_path)
        self.rules = Rules(rules, rules_path)
        self.tls_context = tls_context
        self.implicit_tls = implicit_tls
        self._state: _ServerState | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._recorder: Recorder | None = None

    @property
    def sessions(self) -> int:
        """How many SMTP connections the sink has accepted so far."""
        return self._state.sessions if self._state is not None else 0

    def set_rules(self, rules: dict[str, Any]) -> None:
        """Replace the scripted replies while running."""
        self.rules.replace(rules)

    def start(self) -> int:
        """Start listening; returns the bound port once connections are accepted."""
        if self._thread is not None:
            raise RuntimeError("sink already running")
        keeper = MailKeeper(self.keep_dir, self.keep_last) if self.keep_dir else None
        self._recorder = Recorder(self.record_path, keep_raw=self.keep_raw, keeper=keeper)
        # With implicit TLS (like port 465) the listener is TLS; otherwise a
        # TLS context is offered through STARTTLS.
        listener_tls = self.tls_context if self.implicit_tls else None
        starttls = None if self.implicit_tls else self.tls_context
        state = self._state = _ServerState(SinkHandler(self.rules, self._recorder), starttls)
        # The loop is created and run on its own thread: the caller's thread may already
        # run an event loop (Playwright's sync API does).
        loop = asyncio.new_event_loop()
        ready: concurrent.futures.Future[asyncio.Server] = concurrent.futures.Future()

        def bind() -> None:
            asyncio.set_event_loop(loop)
            try:
                server = loop.run_until_complete(
                    loop.create_server(state.factory, self.host, self.port, ssl=listener_tls)
                )
            except BaseException as exc:
                ready.set_exception(exc)
                loop.close()
                return
            ready.set_result(server)
            self._run(loop, server)

        self._loop = loop
        self._thread = threading.Thread(target=bind, name="smtp-sink", daemon=True)
        self._thread.start()
        try:
            server = ready.result(timeout=10)
        except BaseException:
            self._thread = None
            self._loop = None
            raise
        self.port = server.sockets[0].getsockname()[1]
        return self.port

    def _run(self, loop: asyncio.AbstractEventLoop, server: asyncio.Server) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            server.close()
            assert self._state is not None
            self._state.abort_connections()
            _cancel_tasks(loop)
            loop.run_until_complete(server.wait_closed())
            loop.close()

    def stop(self) -> None:
        """Stop listening, drop open connections, close the record file."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None
        self._loop = None
        if self._recorder is not None:
            self._recorder.close()

    def all_records(self) -> list[dict[str, Any]]:
        """Every line of the record file (accepted and rejected)."""
        return read_records(self.record_path)

    def records(self) -> list[dict[str, Any]]:
        """The accepted messages recorded so far."""
        return [entry for entry in self.all_records() if "rejected" not in entry]

    def rejections(self) -> list[dict[str, Any]]:
        """The refused attempts recorded so far."""
        return [entry for entry in self.all_records() if "rejected" in entry]

    def raw_messages(self) -> list[bytes]:
        """The bytes of every accepted message, in order (only with ``keep_raw=True``)."""
        if not self.keep_raw:
            raise RuntimeError("this sink was started without keep_raw=True")
        return list(self._recorder.raw) if self._recorder is not None else []

    def __enter__(self) -> SinkServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Parse a record file; a torn last line (sink killed mid-write) is skipped."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def _cancel_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


async def _serve(
    host: str, port: int, state: _ServerState, announce: Callable[[str, int], None]
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await loop.create_server(state.factory, host, port)
    announce(host, server.sockets[0].getsockname()[1])
    await stop.wait()
    server.close()
    state.abort_connections()
    await server.wait_closed()


def _announce(host: str, port: int) -> None:
    click.echo(f"smtp-sink listening on {host}:{port}")
    sys.stdout.flush()


@click.command("smtp-sink")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=2525, show_default=True, type=int, help="Port (0 = any free).")
@click.option(
    "--record",
    "record_path",
    default="smtp-sink.jsonl",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON-lines file that every accepted or refused message is appended to.",
)
@click.option(
    "--rules",
    "rules_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON file of scripted replies (re-read when it changes).",
)
@click.option("--quiet", is_flag=True, help="Do not echo each message to stderr.")
@click.option(
    "--keep",
    "keep_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to keep each accepted message in whole (<id>.eml + <id>.json).",
)
@click.option("--keep-last", default=KEEP_LAST, show_default=True,
              type=click.IntRange(min=1), help="How many messages --keep holds (oldest go).")
def smtp_sink_command(
    host: str, port: int, record_path: Path, rules_path: Path | None, quiet: bool,
    keep_dir: Path | None, keep_last: int,
) -> None:
    """Run a local SMTP server that records what it gets and answers as scripted."""
    if rules_path is not None:
        try:
            _check_rules(json.loads(rules_path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"{rules_path}: {exc}", param_hint="--rules") from None
    rules = Rules(path=rules_path)
    try:
        keeper = MailKeeper(keep_dir, keep_last) if keep_dir is not None else None
    except OSError as exc:
        raise click.BadParameter(f"{keep_dir}: {exc}", param_hint="--keep") from None
    recorder = Recorder(record_path, echo=not quiet, keeper=keeper)
    state = _ServerState(SinkHandler(rules, recorder), tls_context=None)
    try:
        asyncio.run(_serve(host, port, state, _announce))
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None
    finally:
        recorder.close()
