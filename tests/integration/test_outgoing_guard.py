"""The SSRF guard: every URL SendDock fetches goes through
``workers.core.outgoing`` — event webhooks, SNS signing certificates and subscription
confirmations. Asserted against real HTTP servers on loopback: what they received (or
not), and what SendDock stored and shows."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import free_port
from tests.helpers import Browser, accepted_campaign
from webapp.inbound_webhooks import SnsCertificates, WebhookRejected
from workers.after_acceptance import event_queue
from workers.after_acceptance.event_webhooks import EventDeliverer, new_secret
from workers.core import outgoing
from workers.core.outgoing import Guard

LOOPBACK = Guard.parse_allow("127.0.0.1", timeout=3)


class Server:
    """A real HTTP server on 127.0.0.1 answering every request with ``status``,
    ``headers`` and ``body``, recording what it got."""

    def __init__(self, status: int = 200, body: bytes = b"ok",
                 headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}
        self.got: list[tuple[str, str, str]] = []  # (method, path, Host header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.got.append((self.command, self.path, self.headers.get("Host", "")))
                self.send_response(server.status)
                for name, value in server.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture()
def servers() -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def make(**kwargs: Any) -> Server:
        made.append(Server(**kwargs))
        return made[-1]

    yield make
    for server in made:
        server.httpd.shutdown()
        server.httpd.server_close()


# Every spelling of an internal address the probe used, and more of the same class.
INTERNAL = [
    "http://127.0.0.1:{port}/hook", "http://localhost:{port}/hook", "http://[::1]:{port}/",
    "http://2130706433:{port}/", "http://0x7f.1:{port}/", "http://0177.0.0.1:{port}/",
    "http://127.1:{port}/", "http://0x7f000001:{port}/", "http://127.0.0.1.:{port}/",
    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://192.168.1.1/",
    "http://172.16.0.1/", "http://100.64.0.1/", "http://0.0.0.0:{port}/", "http://[::]/",
    "http://224.0.0.1/", "http://255.255.255.255/", "http://240.0.0.1/",
    "http://[::ffff:127.0.0.1]:{port}/", "http://[::ffff:7f00:1]:{port}/",
    "http://[fe80::1]/", "http://[fc00::1]/", "http://[ff02::1]/",
    "http://[2002:7f00:1::]/", "http://[64:ff9b::7f00:1]/", "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",
]
NOT_HTTP = ["ftp://127.0.0.1/x", "file:///etc/passwd", "gopher://127.0.0.1:70/",
            "http://user:pw@example.com/", "http:///nohost", "http://[::1/"]


def test_internal_addresses_in_every_spelling_are_refused_before_connecting(
        servers: Callable[..., Server]) -> None:
    server = servers()
    for template in INTERNAL + NOT_HTTP:
        url = template.format(port=server.port)
        with pytest.raises(outgoing.Refused):
            outgoing.request("POST", url, Guard(timeout=2), body=b"{}")
    assert server.got == []  # nothing reached the internal receiver
    # The allow-list names the tests' receiver: then (and only then) it is called.
    assert outgoing.request("POST", server.url(), LOOPBACK, body=b"{}").status == 200
    assert len(server.got) == 1
    with pytest.raises(outgoing.Refused):  # numeric spellings stay refused, allowed or not
        outgoing.request("GET", f"http://2130706433:{server.port}/", LOOPBACK)


def _deliver_once(engine: sa.Engine, url: str, guard: Guard) -> dict[str, Any]:
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM webhook_endpoints"))
        event_queue.create_endpoint(conn, url=url, secret=new_secret(), events=["sent"])
    accepted_campaign(engine, [f"g{time.monotonic_ns()}@example.com"])
    EventDeliverer(engine, "guard-test", schedule=(60,), disable_after=5, guard=guard
                   ).run_once()
    with engine.connect() as conn:
        [endpoint] = event_queue.endpoints(conn)
    return dict(endpoint)


def test_event_webhooks_to_internal_addresses_are_not_called(
        engine: sa.Engine, servers: Callable[..., Server]) -> None:
    server = servers()
    endpoint = _deliver_once(engine, server.url(), Guard(timeout=2))
    assert server.got == []
    assert endpoint["last_status"] is None and "internal address" in endpoint["last_response"]
    endpoint = _deliver_once(engine, server.url(), LOOPBACK)
    assert len(server.got) == 1 and endpoint["last_status"] == 200


def test_redirects_are_not_followed_and_only_a_short_clean_excerpt_is_kept(
        engine: sa.Engine, servers: Callable[..., Server]) -> None:
    secret_place = servers(body=b"internal secret")
    redirect = servers(status=302, headers={"Location": secret_place.url("/admin")},
                       body=b"x" * 50 + b"\x1b[31m\x00\r\nred" + b"y" * 3000)
    endpoint = _deliver_once(engine, redirect.url(), LOOPBACK)
    assert secret_place.got == [] and len(redirect.got) == 1
    assert endpoint["last_status"] == 302  # an answer like any other: not delivered
    kept = endpoint["last_response"]
    assert len(kept) <= outgoing.EXCERPT_CHARS
    assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in kept), kept


def test_the_error_text_does_not_tell_a_closed_port_from_an_open_one(
        servers: Callable[..., Server]) -> None:
    closed = free_port()
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, then says nothing
    hangup = socket.create_server(("127.0.0.1", 0))  # accepts and closes at once
    stop = threading.Event()

    def hang_up() -> None:
        while not stop.is_set():
            try:
                conn, _ = hangup.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    guard = Guard.parse_allow("127.0.0.1", timeout=1)
    try:
        answers = []
        for port in (closed, silent.getsockname()[1], hangup.getsockname()[1]):
            started = time.monotonic()
            answer = outgoing.request("POST", f"http://127.0.0.1:{port}/", guard, body=b"{}")
            answers.append((answer.status, answer.error))
            assert time.monotonic() - started < 10  # the deadline holds
    finally:
        stop.set()
        silent.close()
        hangup.close()
    assert answers == [(None, outgoing.NO_ANSWER)] * 3


def test_the_connection_goes_to_the_address_that_was_checked(
        servers: Callable[..., Server], monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebinding DNS server answers a public (here: allowed) address to the check and
    an internal one to a second lookup: there is no second lookup."""
    server = servers()
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":
            lookups.append(host)
            address = "127.0.0.1" if len(lookups) == 1 else "10.66.66.66"
            return real(address, *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    answer = outgoing.request("GET", f"http://rebind.test:{server.port}/x", LOOPBACK)
    assert answer.status == 200 and lookups == ["rebind.test"]
    assert server.got == [("GET", "/x", f"rebind.test:{server.port}")]


def test_sns_certificates_go_through_the_guard_and_failures_are_cached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real(
        "127.0.0.1" if host.endswith(".amazonaws.com") else host, *a, **k))
    certificates = SnsCertificates(guard=Guard(timeout=2), max_failures=3)
    url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem"
    for _ in range(3):  # an SNS host that resolves inside: refused, fetched once
        with pytest.raises(WebhookRejected) as refused:
            certificates.get(url)
        assert refused.value.status == 403
    assert certificates.fetches == 1
    for i in range(5):  # ever new URLs: after max_failures, no more fetches
        with pytest.raises(WebhookRejected):
            certificates.get(f"https://sns.us-east-1.amazonaws.com/n{i}.pem")
    assert certificates.fetches == 3


def test_the_admin_form_refuses_internal_urls(client: Any, engine: sa.Engine,
                                              make_user: Callable[..., Any]) -> None:
    browser = Browser(client, make_user("admin"))
    for url in ("http://127.0.0.1:5432/", "http://2130706433/", "http://[::1]/",
                "http://169.254.169.254/latest/meta-data/", "http://["):
        page = browser.client.post("/admin/event-webhooks/", data={
            "url": url, "events": ["sent"], "csrf_token": browser.token},
            follow_redirects=True)
        assert page.status_code == 200, url
        text = page.get_data(as_text=True)
        assert "cannot be called" in text or "must be an http" in text, url
    with engine.connect() as conn:
        assert event_queue.endpoints(conn) == []
