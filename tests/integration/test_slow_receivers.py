"""One slow event-webhook receiver must not stall the others.

Real HTTP receivers on loopback: fast ones that answer at once, and a slow one that
dribbles its answer one byte at a time (headers or body), a fixed number of bytes. The
deadline (``SENDDOCK_EVENT_WEBHOOK_TIMEOUT``, small here) holds for the whole exchange —
the slow receiver is cut off long before its last byte — and the other endpoints'
deliveries, those due with it and those queued while it dribbles, arrive before it ends.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers import accepted_campaign
from workers.after_acceptance import event_queue
from workers.after_acceptance.event_webhooks import EventDeliverer, new_secret
from workers.core import outgoing

DEADLINE = 1.5
DRIBBLE_INTERVAL = 0.1
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Padding: " + b"p" * 60 + \
    b"\r\nContent-Length: 2\r\n\r\nok"
# Unhindered, the slow receiver would take len(ANSWER) * DRIBBLE_INTERVAL (~9 s); cut at
# the deadline it sends about DEADLINE / DRIBBLE_INTERVAL bytes.
CUT_BEFORE = len(ANSWER) // 2


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


class Server:
    """A real TCP server on 127.0.0.1 speaking just enough HTTP. ``dribble``: None answers
    at once; "head" sends the whole answer a byte at a time; "body" sends the head at once
    and the body a byte at a time (a longer body then)."""

    def __init__(self, dribble: str | None = None) -> None:
        self.dribble = dribble
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received: list[float] = []  # when each request was read
        self.sent: list[int] = []  # bytes sent per connection, when it ended
        self.ended: list[float] = []  # when each connection ended
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        sent = 0
        try:
            _read_request(conn)
            self.received.append(time.monotonic())
            if self.dribble is None:
                conn.sendall(ANSWER)
                sent = len(ANSWER)
            else:
                answer = ANSWER if self.dribble == "head" else (
                    b"HTTP/1.1 200 OK\r\nContent-Length: 90\r\n\r\n" + b"x" * 90)
                first = 0 if self.dribble == "head" else answer.index(b"\r\n\r\n") + 4
                conn.sendall(answer[:first])
                sent = first
                for i in range(first, len(answer)):  # bounded by the answer's length
                    conn.sendall(answer[i:i + 1])
                    sent += 1
                    time.sleep(DRIBBLE_INTERVAL)
        except OSError:
            pass
        finally:
            self.sent.append(sent)
            self.ended.append(time.monotonic())
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.sock.close()


@pytest.fixture()
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.close()


GUARD = outgoing.Guard.parse_allow("127.0.0.1", timeout=DEADLINE)


@pytest.mark.parametrize("dribble", ["head", "body"])
def test_the_deadline_holds_for_the_whole_exchange(servers: list[Server],
                                                   dribble: str) -> None:
    slow = Server(dribble)
    servers.append(slow)
    answer = outgoing.request("POST", slow.url, GUARD, body=b"{}")
    assert answer.status is None and answer.error == outgoing.NO_ANSWER
    for _ in range(200):  # the server notices the closed connection at its next byte
        if slow.sent:
            break
        time.sleep(DRIBBLE_INTERVAL)
    [sent] = slow.sent
    total = len(ANSWER) if dribble == "head" else 129
    assert sent < total - 40, f"{sent} of {total} bytes sent: not cut at the deadline"


def _endpoint(engine: sa.Engine, url: str) -> int:
    with engine.begin() as conn:
        return int(event_queue.create_endpoint(conn, url=url, secret=new_secret(),
                                               events=["sent"]))


def test_a_slow_receiver_does_not_delay_the_others(engine: sa.Engine,
                                                   servers: list[Server]) -> None:
    slow = Server("head")
    fast = [Server() for _ in range(3)]
    servers.extend([slow, *fast])
    slow_id = _endpoint(engine, slow.url)
    fast_ids = [_endpoint(engine, server.url) for server in fast]
    accepted_campaign(engine, ["a@example.com", "b@example.com"])
    deliverer = EventDeliverer(engine, "slow-test", schedule=(60,), disable_after=0,
                               guard=GUARD)
    lanes = deliverer.start_due()
    assert set(lanes) == {slow_id, *fast_ids}
    for endpoint_id in fast_ids:
        assert lanes[endpoint_id].result() == 2
    # Queued while the slow receiver dribbles: delivered without waiting for it.
    accepted_campaign(engine, ["c@example.com", "d@example.com", "e@example.com"])
    more = deliverer.start_due()
    assert set(more) == set(fast_ids)  # the slow endpoint's lane is still running
    for endpoint_id in fast_ids:
        assert more[endpoint_id].result() == 3
    assert not lanes[slow_id].done()
    assert lanes[slow_id].result() == 1  # failed at the deadline; its second one waits
    for _ in range(200):
        if slow.sent:
            break
        time.sleep(DRIBBLE_INTERVAL)
    [sent] = slow.sent
    assert sent < CUT_BEFORE, f"{sent} of {len(ANSWER)} bytes: not cut at the deadline"
    slow_end = slow.ended[0]
    for server in fast:
        assert len(server.received) == 5
        assert max(server.received) < slow_end
    with engine.connect() as conn:
        rows: Any = conn.execute(sa.text(
            "SELECT status, attempts, last_error FROM webhook_deliveries "
            "WHERE endpoint_id = :e ORDER BY id"), {"e": slow_id}).all()
        delivered = conn.execute(sa.text(
            "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = ANY(:e) "
            "AND status = 'delivered'"), {"e": fast_ids}).scalar_one()
    assert delivered == 15
    assert [(r.attempts, r.last_error) for r in rows[:2]] == [
        (1, outgoing.NO_ANSWER), (0, None)]
    deliverer.close()
