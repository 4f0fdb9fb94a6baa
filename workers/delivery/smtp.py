"""SMTP transport: one kept-open relay connection per worker thread.

``SmtpTransport.send`` turns every SMTP or network outcome into a classified
``SendResult`` naming the stage it happened at (see ``workers.delivery.classify``); it
never raises for relay, network or TLS problems, so a worker loop only has to
look at ``result.reply_class``.

What a real relay needs (docs/design.md §16): the EHLO name is ``SENDDOCK_SMTP_HELO`` or this host's
FQDN, never ``localhost`` (an address literal when the host has no dotted name); one AUTH
mechanism per connection (the best the relay offers), never a cascade of failed logins;
a private CA trusted with ``SENDDOCK_SMTP_CA_FILE``; a kept-open connection is recycled
(QUIT and reconnect) after ``max_messages`` transactions or ``max_age`` seconds, as
Postfix's own client does, so a relay's reload is seen.
"""

from __future__ import annotations

import contextlib
import functools
import re
import smtplib
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# Relay URLs are parsed in core (the settings check them); the pool imports these from here.
from workers.core.relays import RelaySpec, SmtpConfig, parse_relays, route  # noqa: F401
from workers.delivery.classify import (
    NOT_ABOUT_RECIPIENT,
    ReplyClass,
    classify_reply,
    is_login_refusal,
    parse_enhanced,
)

#: AUTH mechanisms smtplib can speak, best first; exactly one is tried per connection.
AUTH_PREFERENCE = ("CRAM-MD5", "PLAIN", "LOGIN")
#: Classes after which the connection is closed rather than RSET (the relay's trouble).
_DROP_AFTER = frozenset({ReplyClass.RELAY, ReplyClass.RELAY_THROTTLE})
_LINE_END = re.compile(rb"\r\n|\r|\n")
_LEADING_DOT = re.compile(rb"(?m)^\.")
# An address smtplib.quoteaddr would only wrap in <>: no parsing for it (email.utils'
# parser was a twentieth of a message's CPU in the drain).
_PLAIN_ADDRESS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9.-]+\Z")


def quoteaddr(address: str) -> str:
    """``smtplib.quoteaddr``, without parsing an address that is plain already."""
    if _PLAIN_ADDRESS.match(address):
        return f"<{address}>"
    return smtplib.quoteaddr(address)



class LoginGate:
    """Shared by the transports of one process: until a login has worked, only one
    connection at a time may try AUTH, and once the relay refused it no other connection
    tries again until a probe's login works. So a wrong password costs one failed AUTH per
    process, not one per worker thread (a fail2ban jail counts every one)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proven = False
        self.refused: tuple[int, bytes | str] | None = None

    def reset(self) -> None:
        with self.lock:
            self.proven, self.refused = False, None


@dataclass
class SendResult:
    """The outcome of one delivery attempt (or relay probe)."""

    reply_class: ReplyClass
    code: int | None
    enhanced: str | None
    text: str
    stage: str
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.reply_class is ReplyClass.SENT

    @property
    def login_refused(self) -> bool:
        """The relay refused (or demands) our credentials: "login refused"."""
        return is_login_refusal(self.code, self.text, self.stage)


@functools.cache
def default_helo() -> str | None:
    """This host's FQDN for EHLO, or None when it has no dotted, non-localhost name (then
    the connection's own address literal is used). Resolved once per process: smtplib
    would call getfqdn() on every new connection."""
    name = socket.getfqdn()
    if "." not in name or name.startswith("localhost") or name.endswith(".localdomain"):
        return None
    return name


def _smtp_data(message: bytes) -> bytes:
    """The message as SMTP DATA payload: CRLF line ends, dot-stuffed, terminated."""
    if message.count(b"\n") != message.count(b"\r\n") or message.count(b"\r") != message.count(
        b"\r\n"
    ):
        message = _LINE_END.sub(b"\r\n", message)
    if message[:1] == b"." or b"\n." in message:
        message = _LEADING_DOT.sub(b"..", message)
    if not message.endswith(b"\r\n"):
        message += b"\r\n"
    return message + b".\r\n"


def _reply_text(reply: bytes | str) -> str:
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    return reply


class SmtpTransport:
    """A relay connection kept open across messages, for one thread at a time.

    The connection is opened on the first ``send``/``probe`` and reopened
    lazily after it broke or after a relay-class failure. ``connects`` counts
    the connections that were fully set up (greeted, EHLO, TLS and AUTH done):
    a test and metrics hook showing the connection is reused.
    """

    def __init__(
        self,
        config: SmtpConfig,
        timeout: float = 30.0,
        local_hostname: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        *,
        ca_file: str | None = None,
        max_messages: int = 100,
        max_age: float = 300.0,
        login_gate: LoginGate | None = None,
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.local_hostname = local_hostname
        self.ca_file = ca_file
        self.max_messages = max_messages
        self.max_age = max_age
        self.login_gate = login_gate or LoginGate()
        self._probing = False
        self.connects = 0
        self.auth_attempts = 0  # AUTH commands sent (one per connection at most)
        self._ssl_context = ssl_context
        self._smtp: smtplib.SMTP | None = None
        self._stage = "connect"
        self._opened_at = 0.0
        self._transactions = 0

    # -- connection --------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            context = ssl.create_default_context()
            if self.ca_file:
                context.load_verify_locations(cafile=self.ca_file)
            if not self.config.verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._ssl_context = context
        return self._ssl_context

    def _open(self) -> smtplib.SMTP | smtplib.SMTPResponseException:
        """Connect, greet, EHLO, STARTTLS and AUTH; a refusal comes back as an exception value.

        Network errors propagate; ``self._stage`` tells the caller where.
        """
        config = self.config
        hostname = self.local_hostname or default_helo()
        self._stage = "connect"
        smtp: smtplib.SMTP
        # A placeholder name keeps smtplib from calling getfqdn(); the real one is set
        # below, once the connection's own address is known.
        if config.tls == "ssl":
            smtp = smtplib.SMTP_SSL(local_hostname="pending", timeout=self.timeout,
                                    context=self._tls_context())
        else:
            smtp = smtplib.SMTP(local_hostname="pending", timeout=self.timeout)
        # The host name STARTTLS and implicit TLS check the certificate against (the
        # constructor would set it, but only when it connects itself).
        smtp._host = config.host  # type: ignore[attr-defined]
        code, reply = smtp.connect(config.host, config.port)
        if code != 220:  # the greeting was not 220
            self._stage = "greeting"
            smtp.close()
            return smtplib.SMTPResponseException(code, reply)
        assert smtp.sock is not None
        smtp.local_hostname = hostname or f"[{smtp.sock.getsockname()[0]}]"
        self._smtp = smtp
        refusal = self._ehlo(smtp)
        if refusal is None and config.tls == "starttls":
            self._stage = "starttls"
            smtp.starttls(context=self._tls_context())
            refusal = self._ehlo(smtp)
        if refusal is None and config.username:
            self._stage = "auth"
            self._login(smtp)
        if refusal is None:
            self.connects += 1
            self._opened_at = time.monotonic()
            self._transactions = 0
            return smtp
        return refusal

    def _login(self, smtp: smtplib.SMTP) -> None:
        """AUTH with the one best mechanism the relay offers: a wrong password costs one
        failed login per connection, never smtplib's cascade of three (a fail2ban jail
        counts each). Raises SMTPAuthenticationError for a refusal."""
        offered = (smtp.esmtp_features.get("auth") or "").upper().split()
        mechanism = next((m for m in AUTH_PREFERENCE if m in offered), None)
        if mechanism is None:
            raise smtplib.SMTPNotSupportedError(
                "the relay offers no AUTH mechanism we can use "
                f"(offered: {' '.join(offered) or 'none'})")
        smtp.user, smtp.password = self.config.username or "", self.config.password or ""
        authobject = getattr(smtp, "auth_" + mechanism.lower().replace("-", "_"))
        gate = self.login_gate
        with contextlib.nullcontext() if gate.proven else gate.lock:
            # Until a login worked, one at a time; once refused, only a probe may knock.
            if gate.refused is not None and not self._probing:
                raise smtplib.SMTPAuthenticationError(*gate.refused)
            self.auth_attempts += 1
            try:
                smtp.auth(mechanism, authobject)
            except smtplib.SMTPAuthenticationError as exc:
                gate.proven, gate.refused = False, (exc.smtp_code, exc.smtp_error)
                raise
            gate.proven, gate.refused = True, None

    def _worn_out(self) -> bool:
        return (self._transactions >= self.max_messages
                or time.monotonic() - self._opened_at >= self.max_age)

    def _ehlo(self, smtp: smtplib.SMTP) -> smtplib.SMTPResponseException | None:
        self._stage = "ehlo"
        code, reply = smtp.ehlo()
        if code != 250:
            code, reply = smtp.helo()
        return None if code == 250 else smtplib.SMTPResponseException(code, reply)

    def _drop(self) -> None:
        """Close the socket without QUIT: used after failures, never blocks."""
        smtp, self._smtp = self._smtp, None
        if smtp is not None:
            smtp.close()

    def _reset(self) -> None:
        """RSET after a refused RCPT/DATA so the next message starts clean."""
        smtp = self._smtp
        if smtp is None:
            return
        try:
            code, _reply = smtp.rset()
        except (smtplib.SMTPException, OSError):
            code = -1
        if code != 250:
            self._drop()

    def close(self) -> None:
        """Say QUIT (best effort) and close; the next send reconnects."""
        smtp, self._smtp = self._smtp, None
        if smtp is None:
            return
        try:
            if smtp.sock is not None:
                smtp.quit()
        except (smtplib.SMTPException, OSError):
            pass
        finally:
            smtp.close()

    # -- results -----------------------------------------------------------

    def _result(self, code: int | None, reply: bytes | str, started: float) -> SendResult:
        """Classify a reply at the current stage and leave the connection usable or closed."""
        stage = self._stage
        text = _reply_text(reply)
        reply_class = classify_reply(code, text, stage)
        if self._smtp is not None and self._smtp.sock is None:
            self._smtp = None  # smtplib closed it itself (EOF, line too long)
        if code is None or reply_class in _DROP_AFTER:
            self._drop()
        elif reply_class is not ReplyClass.SENT and stage in ("rcpt", "data"):
            self._reset()
        return SendResult(
            reply_class=reply_class,
            code=code,
            enhanced=parse_enhanced(text) if code is not None else None,
            text=text,
            stage=stage,
            duration_ms=(time.perf_counter() - started) * 1000.0,
        )

    def _guarded(self, step: Callable[[], SendResult], started: float) -> SendResult:
        """Run one attempt, turning every SMTP/network/TLS error into a result."""
        try:
            return step()
        except smtplib.SMTPResponseException as exc:
            return self._result(exc.smtp_code, exc.smtp_error, started)
        except ssl.SSLError as exc:
            if self._stage == "connect":
                self._stage = "starttls"  # implicit TLS handshake (tls=ssl)
            return self._result(None, f"TLS error: {exc}", started)
        except (smtplib.SMTPException, OSError) as exc:
            return self._result(None, str(exc) or type(exc).__name__, started)

    def _with_retry_on_stale(self, step: Callable[[], SendResult]) -> SendResult:
        started = time.perf_counter()
        reused = self._smtp is not None
        result = self._guarded(step, started)
        if reused and result.stage in ("mail", "noop") and result.code in (None, 421):
            # A kept-open connection the relay dropped (or announced closing)
            # while we were idle: that says nothing about the relay's health,
            # so try once more on a fresh connection before reporting it.
            result = self._guarded(step, time.perf_counter())
        return result

    # -- public API --------------------------------------------------------

    def send(self, envelope_from: str, recipient: str, message: bytes,
             before_data: Callable[[], None] | None = None) -> SendResult:
        """Deliver one message to one recipient through the relay.

        Guarantees: never raises for SMTP, network or TLS errors -- every
        outcome is a SendResult classified per ``workers.delivery.classify`` with the
        stage it happened at; SENT means the relay accepted the message (250
        after the final dot). After a relay-class failure or a lost connection
        the connection is closed; after a refused RCPT/DATA it is RSET. Raises
        ValueError only for an envelope sender containing CR or LF.

        ``before_data`` runs once the relay has said 354, just before the message goes
        out (the drain waits there for the previous outcome's commit); whatever it raises
        is raised from here, with the connection closed: that message was not sent.
        """
        if "\r" in envelope_from or "\n" in envelope_from:
            raise ValueError("envelope sender contains a line break")
        if "\r" in recipient or "\n" in recipient or not recipient.strip():
            return SendResult(
                ReplyClass.REJECTED, None, None, "invalid recipient address", "rcpt", 0.0
            )
        if self._smtp is not None and self._worn_out():
            self.close()  # recycle: QUIT and reconnect, as Postfix's own client does
        return self._with_retry_on_stale(
            lambda: self._transaction(envelope_from, recipient, message, before_data)
        )

    def _transaction(self, envelope_from: str, recipient: str, message: bytes,
                     before_data: Callable[[], None] | None = None) -> SendResult:
        started = time.perf_counter()
        opened = self._smtp if self._smtp is not None else self._open()
        if isinstance(opened, smtplib.SMTPResponseException):
            return self._result(opened.smtp_code, opened.smtp_error, started)
        smtp = opened
        self._stage = "mail"
        self._transactions += 1
        options: list[str] = []
        if not (envelope_from.isascii() and recipient.isascii()):
            if not smtp.has_extn("smtputf8"):
                self._stage = "rcpt"
                return SendResult(
                    ReplyClass.REJECTED,
                    None,
                    None,
                    "non-ASCII address but the relay does not support SMTPUTF8",
                    "rcpt",
                    0.0,
                )
            options.append("SMTPUTF8")
        if not options and smtp.has_extn("pipelining"):
            return self._pipelined(smtp, envelope_from, recipient, message, started,
                                   before_data)
        code, reply = smtp.mail(envelope_from, options)
        if code != 250:
            return self._result(code, reply, started)
        self._stage = "rcpt"
        code, reply = smtp.rcpt(recipient)
        if code not in (250, 251):
            return self._result(code, reply, started)
        self._stage = "data"
        code, reply = smtp.docmd("DATA")
        if code != 354:
            return self._result(code, reply, started)
        self._before_data(before_data)
        self._stage = "send"
        smtp.send(_smtp_data(message))
        self._stage = "data_end"
        code, reply = smtp.getreply()
        return self._result(code, reply, started)

    def _pipelined(self, smtp: smtplib.SMTP, envelope_from: str, recipient: str,
                   message: bytes, started: float,
                   before_data: Callable[[], None] | None = None) -> SendResult:
        """MAIL, RCPT and DATA in one write, their replies read in order (RFC 2920): two
        round trips per message instead of four. Every reply is read, so the session stays
        in step whichever command was refused; each refusal is classified at its stage."""
        smtp.send(f"MAIL FROM:{quoteaddr(envelope_from)}\r\n"
                  f"RCPT TO:{quoteaddr(recipient)}\r\nDATA\r\n")
        self._stage = "mail"
        mail = smtp.getreply()
        if mail[0] == 421:
            return self._result(*mail, started)  # the relay is closing the channel
        self._stage = "rcpt"
        rcpt = smtp.getreply()
        if rcpt[0] == 421:
            return self._result(*rcpt, started)
        self._stage = "data"
        data = smtp.getreply()
        if data[0] == 354 and (mail[0] != 250 or rcpt[0] not in (250, 251)):
            # A relay that opened DATA although the envelope was refused: end it empty.
            smtp.send(b".\r\n")
            smtp.getreply()
        if mail[0] != 250:
            self._stage = "mail"
            return self._result(*mail, started)
        if rcpt[0] not in (250, 251):
            self._stage = "rcpt"
            return self._result(*rcpt, started)
        if data[0] != 354:
            return self._result(*data, started)
        self._before_data(before_data)
        self._stage = "send"
        smtp.send(_smtp_data(message))
        self._stage = "data_end"
        code, reply = smtp.getreply()
        return self._result(code, reply, started)

    def _before_data(self, hook: Callable[[], None] | None) -> None:
        if hook is None:
            return
        try:
            hook()
        except BaseException:
            self._drop()  # mid-DATA: only closing the connection keeps the message unsent
            raise

    def probe(self, envelope_from: str | None = None,
              recipient: str | None = None) -> SendResult:
        """Check the relay: connect, EHLO, STARTTLS, AUTH (as configured), NOOP and, with
        ``envelope_from``, MAIL FROM (and with ``recipient`` RCPT TO) followed by RSET: a
        relay that refuses our sender, or reports our client/HELO/relaying refusal only at
        RCPT (Postfix's ``smtpd_delay_reject``), is not healthy. A refusal at RCPT that is
        about that recipient itself does not make the relay unhealthy.

        Guarantees: never raises for SMTP/network/TLS errors; SENT means the
        relay is healthy and the connection is kept for the next send.
        """
        if self._smtp is not None and self._worn_out():
            self.close()
        self._probing = True
        try:
            result = self._with_retry_on_stale(self._noop)
        finally:
            self._probing = False
        if result.reply_class is not ReplyClass.SENT or envelope_from is None:
            return result
        return self._guarded(lambda: self._mail_then_rset(envelope_from, recipient),
                             time.perf_counter())

    def _noop(self) -> SendResult:
        started = time.perf_counter()
        opened = self._smtp if self._smtp is not None else self._open()
        if isinstance(opened, smtplib.SMTPResponseException):
            return self._result(opened.smtp_code, opened.smtp_error, started)
        self._stage = "noop"
        code, reply = opened.noop()
        return self._result(code, reply, started)

    def _mail_then_rset(self, envelope_from: str, recipient: str | None) -> SendResult:
        started = time.perf_counter()
        assert self._smtp is not None
        self._stage = "mail"
        self._transactions += 1
        code, reply = self._smtp.mail(envelope_from)
        if code != 250:
            return self._result(code, reply, started)
        if recipient is not None:
            self._stage = "rcpt"
            code, reply = self._smtp.rcpt(recipient)
            if code not in (250, 251):
                refused = self._result(code, reply, started)
                if refused.reply_class in NOT_ABOUT_RECIPIENT:
                    return refused
                if self._smtp is None:
                    return refused
        self._stage = "noop"
        code, reply = self._smtp.rset()
        return self._result(code, reply, started)

    @property
    def session(self) -> smtplib.SMTP | None:
        """The open SMTP session, None when closed: ``senddock check`` reads the relay's
        EHLO features and the TLS certificate from it."""
        return self._smtp

    def __enter__(self) -> SmtpTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
