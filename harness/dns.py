"""A real DNS server on loopback for the tests: dnslib's server, UDP and TCP on one free
port, answering from a zone the test writes (TXT for SPF/DKIM/DMARC, MX, A, AAAA, CNAME).

Answers over UDP are truncated at 512 bytes like a classic server's, so a client that
needs the long TXT record of an RSA-2048 DKIM key has to retry over TCP, as it must in
the world. Every query is logged (``DnsServer.queries``): a test can assert that the code
under test asked *this* server and nothing else.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from dnslib import AAAA, CNAME, MX, QTYPE, RCODE, RR, TXT, A, DNSLabel, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

_RDATA = {"A": A, "AAAA": AAAA, "CNAME": CNAME}


def _name(name: str) -> str:
    return name.rstrip(".").lower() + "."


def txt_strings(value: str) -> list[bytes]:
    """A TXT value as 255-byte character-strings (how a zone file stores a long record)."""
    raw = value.encode("utf-8")
    return [raw[i:i + 255] for i in range(0, len(raw), 255)] or [b""]


@dataclass
class Zone:
    """Records by owner name; tests add and remove them while the server runs."""

    records: dict[str, list[RR]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, rtype: str, value: str, ttl: int = 60,
            preference: int = 10) -> None:
        """Add one record: ``add("example.com", "MX", "mx.example.com")``,
        ``add("_dmarc.example.com", "TXT", "v=DMARC1; p=none")``."""
        owner = _name(name)
        if rtype == "TXT":
            rdata = TXT(txt_strings(value))
        elif rtype == "MX":
            rdata = MX(_name(value), preference)
        else:
            rdata = _RDATA[rtype](_name(value) if rtype == "CNAME" else value)
        record = RR(owner, getattr(QTYPE, rtype), rdata=rdata, ttl=ttl)
        with self.lock:
            self.records.setdefault(owner, []).append(record)

    def txt(self, name: str, *values: str) -> None:
        for value in values:
            self.add(name, "TXT", value)

    def remove(self, name: str, rtype: str | None = None) -> None:
        owner = _name(name)
        with self.lock:
            kept = [r for r in self.records.get(owner, [])
                    if rtype is not None and r.rtype != getattr(QTYPE, rtype)]
            if kept:
                self.records[owner] = kept
            else:
                self.records.pop(owner, None)

    def clear(self) -> None:
        with self.lock:
            self.records.clear()

    def answer(self, qname: str, qtype: int) -> tuple[int, list[RR]]:
        """(rcode, answers): NXDOMAIN for an unknown name, NOERROR with the matching
        records (following one CNAME) otherwise."""
        with self.lock:
            found = list(self.records.get(qname, []))
        if not found:
            return RCODE.NXDOMAIN, []
        matching = [r for r in found if r.rtype == qtype or qtype == QTYPE.ANY]
        if not matching:
            aliases = [r for r in found if r.rtype == QTYPE.CNAME]
            if aliases:
                target = str(aliases[0].rdata.label).lower()
                _rcode, more = self.answer(target, qtype)
                return RCODE.NOERROR, aliases + more
        return RCODE.NOERROR, matching


class _ZoneResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, zone: Zone, queries: list[tuple[str, str]]) -> None:
        self.zone = zone
        self.queries = queries

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        qname = str(DNSLabel(request.q.qname)).lower()
        qname = qname if qname.endswith(".") else qname + "."
        self.queries.append((qname, QTYPE[request.q.qtype]))
        rcode, answers = self.zone.answer(qname, request.q.qtype)
        reply.header.rcode = rcode
        reply.header.aa = 1
        for record in answers:
            reply.add_answer(record)
        return reply


class _ClassicHandler(DNSHandler):  # type: ignore[misc]
    udplen = 512  # no EDNS: long answers come back truncated, the client retries over TCP


class DnsServer:
    """dnslib's server on 127.0.0.1, UDP and TCP on the same free port, in threads."""

    def __init__(self) -> None:
        self.zone = Zone()
        self.queries: list[tuple[str, str]] = []
        self.host = "127.0.0.1"
        self.port = 0
        self._servers: list[DNSServer] = []

    @property
    def resolver_setting(self) -> str:
        """The value for ``SENDDOCK_DNS_RESOLVER``."""
        return f"{self.host}:{self.port}"

    def start(self) -> DnsServer:
        resolver = _ZoneResolver(self.zone, self.queries)
        logger = DNSLogger(log="-request,-reply,-truncated,-recv,-send,-data", prefix=False)
        for _attempt in range(20):
            port = _free_udp_port(self.host)
            udp = DNSServer(resolver, address=self.host, port=port, tcp=False,
                            logger=logger, handler=_ClassicHandler)
            try:
                tcp = DNSServer(resolver, address=self.host, port=port, tcp=True,
                                logger=logger, handler=_ClassicHandler)
            except OSError:  # the TCP port is someone else's: try another
                udp.server.server_close()
                continue
            servers = [udp, tcp]
            self.port, self._servers = port, servers
            for server in servers:
                server.start_thread()
            return self
        raise RuntimeError("no free loopback port for both UDP and TCP")

    def stop(self) -> None:
        for server in self._servers:
            server.stop()
            server.server.server_close()
        self._servers = []

    def asked(self, name: str, rtype: str | None = None) -> bool:
        """Whether the server was queried for ``name`` (and ``rtype``)."""
        wanted = _name(name)
        return any(q == wanted and (rtype is None or t == rtype) for q, t in self.queries)

    def reset(self) -> None:
        self.zone.clear()
        self.queries.clear()

    def publish(self, records: Iterable[tuple[str, str, str]]) -> None:
        for name, rtype, value in records:
            self.zone.add(name, rtype, value)


def _free_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


_shared: DnsServer | None = None
_shared_lock = threading.Lock()


def shared_server() -> DnsServer:
    """The one DNS server of this test process, started on first use (its threads are
    daemons and end with the process). The ``dns_proc`` fixture is this server, and
    ``tests.conftest.settings`` points every test's SENDDOCK_DNS_RESOLVER at it, so no
    test ever asks a public resolver: a zone nobody wrote answers NXDOMAIN at once."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = DnsServer().start()
        return _shared
