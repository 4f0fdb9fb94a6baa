"""Every request SendDock makes to a URL someone else chose goes through here (SSRF guard).

Event webhooks (an admin's URL), SNS signing certificates and subscription confirmations
(a URL in an anonymous POST, already limited to SNS hosts) are fetched by :func:`request`:

- only ``http://`` and ``https://``, no user info in the URL;
- the host is resolved once and *every* address it resolves to is checked: loopback,
  private, link-local, shared (CGNAT), multicast, unspecified, reserved and documentation
  ranges are refused, also when wrapped in IPv6 (IPv4-mapped ``::ffff:127.0.0.1``, 6to4,
  Teredo, NAT64); a host written as a number in any form but the dotted quad
  (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``) is refused outright;
- the connection goes to the address that was checked (no second lookup a rebinding DNS
  server could answer differently); TLS still checks the certificate against the host name;
- redirects are not followed (a 3xx is an answer like any other);
- one deadline for the whole exchange (connect, TLS, send, the status line and headers,
  the body): a socket's own timeout counts from the last byte, so a receiver dribbling
  one byte a second would never reach it; here a watchdog shuts the connection down when
  the deadline passes, whatever is being waited for (:class:`_Deadline`);
- only the status and a short excerpt of the body with control characters removed are
  kept, and a failure without an HTTP answer is one message whatever the cause, so the
  error text cannot tell an open port from a closed one.

``SENDDOCK_OUTGOING_ALLOW`` (addresses or networks, comma-separated) lets an operator name
internal receivers that may be called anyway (the tests' receivers on 127.0.0.1).

No library fitted: ``advocate`` (the requests-based guard) was last released in 2020 for
urllib3 1.x, and the httpx-based guards are new single-author packages; this is
``http.client`` with the connection pinned to the checked address.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger("senddock.outgoing")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

NO_ANSWER = "no HTTP answer (the connection failed, timed out or did not speak HTTP)"
EXCERPT_CHARS = 200
# NAT64 (RFC 6052) embeds an IPv4 address in its last 32 bits.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# The dotted quad is the only numeric spelling of an IPv4 host accepted.
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]*))*\.?$", re.I)
_DOTTED_QUAD = re.compile(r"^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
                          r"(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


class Refused(Exception):
    """The URL may not be fetched; the message says why and is safe to show."""


class Unresolvable(Refused):
    """The host has no address (now); a form may keep the URL, a request cannot go."""


@dataclass(frozen=True)
class Guard:
    """What may be called and for how long. ``allow``: networks an operator named in
    ``SENDDOCK_OUTGOING_ALLOW``, called even though they are internal."""

    allow: tuple[Network, ...] = ()
    timeout: float = 10.0

    @classmethod
    def parse_allow(cls, value: str | None, timeout: float = 10.0) -> Guard:
        """``"127.0.0.1, 10.0.0.0/8, ::1"`` → a guard; raises ValueError naming a bad item."""
        networks = []
        for item in (value or "").split(","):
            if item.strip():
                networks.append(ipaddress.ip_network(item.strip(), strict=False))
        return cls(tuple(networks), timeout)


@dataclass(frozen=True)
class Answer:
    """What is kept of an exchange: the HTTP status (None: no HTTP answer), a short
    sanitized excerpt of the body, the error text (None when 2xx), and up to
    ``max_bytes`` of the raw body for callers that parse it (certificates)."""

    status: int | None
    excerpt: str
    error: str | None
    body: bytes = b""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _internal(ip: Address) -> bool:
    """True for every address that is not a public unicast one."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None and _internal(inner):
            return True
    return (not ip.is_global or ip.is_multicast or ip.is_private or ip.is_loopback
            or ip.is_link_local or ip.is_unspecified or ip.is_reserved)


def _allowed(ip: Address, guard: Guard) -> bool:
    candidates: list[Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        candidates.append(ip.ipv4_mapped)
    return any(c in net for c in candidates for net in guard.allow if c.version == net.version)


def check_url(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a URL the guard may call, or :class:`Refused`. No DNS."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Refused("the URL is not valid") from None
    if parts.scheme not in ("http", "https"):
        raise Refused("only http:// and https:// URLs can be called")
    if parts.username is not None or parts.password is not None:
        raise Refused("the URL must not carry a user name or password")
    host = parts.hostname or ""
    if not host:
        raise Refused("the URL has no host")
    if _NUMERIC_HOST.match(host) and not _DOTTED_QUAD.match(host):
        raise Refused("write a numeric host as four decimal numbers (a.b.c.d)")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def resolve(host: str, port: int, guard: Guard) -> list[Address]:
    """Every address ``host`` resolves to, all checked; :class:`Refused` if any of them
    is internal and not allowed (a name resolving to one public and one internal address
    is refused: which one a client picks is not ours to guess)."""
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        found = [literal]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise Unresolvable(f"the host {host} does not resolve") from None
        found = []
        for info in infos:
            ip = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if ip not in found:
                found.append(ip)
    for ip in found:
        if _internal(ip) and not _allowed(ip, guard):
            raise Refused(f"the host {host} is an internal address; only public addresses "
                          "can be called (SENDDOCK_OUTGOING_ALLOW names exceptions)")
    if not found:
        raise Unresolvable(f"the host {host} does not resolve")
    return found


def check(url: str, guard: Guard) -> None:
    """Raise :class:`Refused` unless ``url`` may be called now (scheme, host, every
    address it resolves to). For forms: the request itself checks again."""
    _scheme, host, port = check_url(url)
    resolve(host, port, guard)


class _Deadline:
    """The exchange's one deadline: when it passes, the connection's socket is shut down
    from a timer thread, which ends any read or write blocked on it (a socket's timeout
    alone restarts with every byte received). ``expired`` says it fired."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        """Seconds left; TimeoutError when none are."""
        left = self.at - time.monotonic()
        if left <= 0 or self.expired:
            raise TimeoutError("the deadline passed")
        return left

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            expired = self.expired
        if expired:
            self._shut(sock)
            raise TimeoutError("the deadline passed")

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            sock = self._sock
        if sock is not None:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, address: Address, deadline: _Deadline) -> None:
        super().__init__(host, port, timeout=deadline.left())
        self.address = address
        self.deadline = deadline

    def connect(self) -> None:
        self.sock = socket.create_connection((str(self.address), self.port),
                                             self.deadline.left())
        self.deadline.attach(self.sock)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: Address, deadline: _Deadline) -> None:
        super().__init__(host, port, timeout=deadline.left(),
                         context=ssl.create_default_context())
        self.address = address
        self.deadline = deadline

    def connect(self) -> None:
        sock = socket.create_connection((str(self.address), self.port), self.deadline.left())
        self.deadline.attach(sock)  # the TLS handshake is under the deadline too
        # The certificate is checked against the host name, not the address.
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def sanitize(data: bytes, limit: int = EXCERPT_CHARS) -> str:
    """A short excerpt safe to store and show: decoded, control characters and runs of
    whitespace collapsed to one space, at most ``limit`` characters."""
    text = data[: limit * 4].decode("utf-8", "replace")
    return " ".join(_CONTROL.sub(" ", text).split())[:limit]


def _read(response: http.client.HTTPResponse, max_bytes: int, deadline: _Deadline) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < max_bytes:
        deadline.left()
        chunk = response.read(min(8192, max_bytes - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def request(method: str, url: str, guard: Guard, *, body: bytes | None = None,
            headers: dict[str, str] | None = None, max_bytes: int = 4096) -> Answer:
    """One exchange with ``url`` under ``guard``. Raises :class:`Refused` before any
    connection when the URL or its addresses may not be called; every other failure is an
    :class:`Answer` with ``status=None`` and :data:`NO_ANSWER` (the cause is logged)."""
    scheme, host, port = check_url(url)
    addresses = resolve(host, port, guard)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = _Deadline(guard.timeout)
    kind = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    connection = kind(host, port, addresses[0], deadline)
    try:
        connection.request(method, target, body=body, headers=headers or {})
        response = connection.getresponse()
        data = _read(response, max_bytes, deadline)
        if deadline.expired:  # what was read when the watchdog cut it is not an answer
            raise TimeoutError("the deadline passed")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        cause: Exception = exc
        if deadline.expired:
            cause = TimeoutError(f"no complete answer within {guard.timeout:g} s")
        log.info("outgoing %s %s: %s: %s", method, url, type(cause).__name__, cause)
        return Answer(None, "", NO_ANSWER)
    finally:
        deadline.cancel()
        connection.close()
    ok = 200 <= response.status < 300
    return Answer(response.status, sanitize(data), None if ok else f"HTTP {response.status}",
                  data)
