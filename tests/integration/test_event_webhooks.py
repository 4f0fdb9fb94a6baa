"""Outgoing event webhooks against a real HTTP server on loopback: every event (sent,
bounced, complained, failed, unsubscribed) is queued by the database in the same
transaction as its change, signed per Standard Webhooks, retried while the receiver is
down, the endpoint disabled with an alarm when it keeps failing, and everything delivered
once it is back — nothing lost. Asserted on what the receiver got."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import sqlalchemy as sa
from standardwebhooks.webhooks import Webhook

from tests.conftest import free_port, wait_for
from tests.helpers import accepted_campaign, make_campaign, place_jobs
from workers.after_acceptance import event_queue, feedback
from workers.after_acceptance.event_webhooks import EventDeliverer, new_secret
from workers.after_acceptance.pool import worker_pool
from workers.after_acceptance.reports import Feedback
from workers.core import outgoing

# The receivers listen on loopback, which the SSRF guard refuses unless named
# (SENDDOCK_OUTGOING_ALLOW).
RECEIVERS = outgoing.Guard.parse_allow("127.0.0.1", timeout=2)


class Receiver:
    """A real HTTP server (ThreadingHTTPServer on 127.0.0.1) that records every POST and
    answers ``status``; ``stop()``/``start()`` take it down and bring it back on the same
    port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.status = 200
        self.requests: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append({"headers": dict(self.headers), "body": body,
                                          "answered": receiver.status})
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok" if receiver.status < 300 else b"receiver broken")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/senddock"


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def verified(secret: str, requests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The accepted deliveries by webhook-id, each signature checked as a receiver would."""
    hook = Webhook(secret)
    found = {}
    for req in requests:
        if req["answered"] >= 300:
            continue
        headers = {k.lower(): v for k, v in req["headers"].items()}
        payload = hook.verify(req["body"], headers)
        found[headers["webhook-id"]] = payload
    return found


def test_down_then_disabled_then_back_delivers_everything(engine: sa.Engine,
                                                          receiver: Receiver) -> None:
    secret = new_secret()
    with engine.begin() as conn:
        endpoint = event_queue.create_endpoint(conn, url=receiver.url, secret=secret,
                                               events=list(event_queue.EVENTS))
    _campaign, jobs = accepted_campaign(engine, [f"e{i}@example.com" for i in range(5)])
    ids = {email: job["id"] for email, job in jobs.items()}
    with engine.begin() as conn:
        feedback.apply_event(conn, "generic", Feedback("bounce", "e0@example.com", "hard",
                                                       "550 5.1.1 gone"), ids["e0@example.com"],
                             {}, feedback.Thresholds())
        feedback.apply_event(conn, "generic", Feedback("complaint", "e1@example.com"),
                             ids["e1@example.com"], {}, feedback.Thresholds())
        conn.execute(sa.text("INSERT INTO suppressions (email, reason, job_id, note) VALUES "
                             "('e2@example.com', 'unsubscribed', :j, 'one-click')"),
                     {"j": ids["e2@example.com"]})
        # A rolled-back change queues nothing.
    with pytest.raises(RuntimeError), engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'bounced' WHERE id = :j"),
                     {"j": ids["e3@example.com"]})
        raise RuntimeError("rolled back")
    with engine.connect() as conn:
        queued = conn.execute(sa.text("SELECT event, count(*) FROM webhook_deliveries "
                                      "GROUP BY event ORDER BY event")).all()
    assert dict(queued) == {"sent": 5, "bounced": 1, "complained": 1, "unsubscribed": 1}

    deliverer = EventDeliverer(engine, "test-worker", schedule=(0,) * 40,
                               disable_after=3600, guard=RECEIVERS)
    # The receiver is down: connection refused, over and over within seconds -> not
    # disabled (a count of failures is no measure of an endpoint that is gone).
    for _ in range(12):
        deliverer.run_once()
    with engine.connect() as conn:
        assert event_queue.disabled_endpoints(conn) == []
        [ep] = event_queue.endpoints(conn)
    assert ep["consecutive_failures"] == 12 and ep["failing_since"] is not None
    # ...until it has answered no 2xx for the whole hour: then disabled (alarm).
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE webhook_endpoints SET failing_since = failing_since "
                             "- interval '1 hour'"))
    deliverer.run_once()
    with engine.connect() as conn:
        [alarm] = event_queue.disabled_endpoints(conn)
        waiting = conn.execute(sa.text("SELECT count(*) FROM webhook_deliveries WHERE status "
                                       "IN ('pending', 'retry')")).scalar()
    assert alarm["id"] == endpoint
    assert outgoing.NO_ANSWER in alarm["disabled_reason"]
    assert waiting == 8  # nothing failed for good, nothing lost
    assert deliverer.run_once() == 0  # a disabled endpoint is not called

    # Back, but answering 500 at first, then fine.
    receiver.status = 500
    receiver.start()
    with engine.begin() as conn:
        event_queue.set_endpoint_enabled(conn, endpoint, True)
    deliverer.run_once()
    receiver.status = 200
    wait_for(lambda: deliverer.run_once() == 0 and len(verified(secret, receiver.requests)) == 8,
             timeout=20, message="every event to be delivered")
    got = verified(secret, receiver.requests)
    by_event: dict[str, list[dict[str, Any]]] = {}
    for payload in got.values():
        by_event.setdefault(payload["data"]["event"], []).append(payload)
    assert {k: len(v) for k, v in by_event.items()} == {"sent": 5, "bounced": 1,
                                                        "complained": 1, "unsubscribed": 1}
    bounced = by_event["bounced"][0]
    assert bounced["type"] == "message.bounced"
    assert bounced["data"]["kind"] == "broadcast" and bounced["data"]["reason"] == "550 5.1.1 gone"
    assert bounced["data"]["correlation_id"] and bounced["data"]["job_id"] == ids["e0@example.com"]
    with engine.connect() as conn:
        states = dict(conn.execute(sa.text("SELECT status, count(*) FROM webhook_deliveries "
                                           "GROUP BY status")).all())
        [ep] = event_queue.endpoints(conn)
    assert states == {"delivered": 8}
    assert (ep["consecutive_failures"], ep["last_status"], ep["disabled_at"],
            ep["failing_since"]) == (0, 200, None, None)
    # A tampered body fails verification (what the receiver's check is worth).
    req = next(r for r in receiver.requests if r["answered"] == 200)
    with pytest.raises(Exception):  # noqa: B017 (standardwebhooks' own verification error)
        Webhook(secret).verify(req["body"] + b" ", {k.lower(): v for k, v in
                                                    req["headers"].items()})


@pytest.mark.slow
def test_the_pool_delivers_sent_and_failed_events_of_real_sends(
        engine: sa.Engine, config_for: Any, sink: Any, receiver: Receiver) -> None:
    receiver.start()
    secret = new_secret()
    with engine.begin() as conn:
        event_queue.create_endpoint(conn, url=receiver.url, secret=secret,
                                    events=["sent", "failed"], kinds=["broadcast"])
    sink.set_rules({"rules": [{"match": "rejected@example.com",
                               "reply": "554 5.7.1 policy rejection"}]})
    make_campaign(engine, ["a@example.com", "b@example.com", "rejected@example.com"])
    pool = worker_pool(engine, config_for(sink.port, OUTGOING_ALLOW="127.0.0.1"),
                       node="events-test")
    pool.start()
    try:
        wait_for(lambda: len(verified(secret, receiver.requests)) == 3, timeout=30,
                 message="three events from the pool")
    finally:
        pool.stop(timeout=10)
    events = sorted((p["data"]["event"], p["data"]["email"])
                    for p in verified(secret, receiver.requests).values())
    assert events == [("failed", "rejected@example.com"), ("sent", "a@example.com"),
                      ("sent", "b@example.com")]


def test_a_claim_left_by_a_dead_deliverer_is_delivered_after_its_lease(
        engine: sa.Engine, receiver: Receiver) -> None:
    """A deliverer that died between claiming and recording leaves its rows `sending`;
    once the lease ran out another delivers them, with the same webhook-id (at least once,
    never lost)."""
    receiver.start()
    secret = new_secret()
    with engine.begin() as conn:
        event_queue.create_endpoint(conn, url=receiver.url, secret=secret, events=["sent"])
    accepted_campaign(engine, ["lease@example.com"])
    with engine.begin() as conn:
        [claimed] = event_queue.claim_deliveries(conn, "dead-worker", 10)
    deliverer = EventDeliverer(engine, "live-worker", schedule=(0,), disable_after=3,
                               guard=RECEIVERS)
    assert deliverer.run_once() == 0  # the dead worker's lease still holds
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE webhook_deliveries SET claimed_at = now() - "
                             "interval '10 minutes'"))
    assert deliverer.run_once() == 1
    [payload_id] = verified(secret, receiver.requests)
    assert payload_id == claimed.msg_id
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status FROM webhook_deliveries")).scalar() == \
            "delivered"


def test_the_alarm_is_for_admins_and_never_shows_credentials_or_query(
        engine: sa.Engine, app: Any, make_user: Any) -> None:
    """The banner showed on every page, for marketers too, with the endpoint's
    full URL (credentials and query string included)."""
    from tests.helpers import Browser
    from webapp.domain import health

    secret_url = "https://hook-user:s3cr3t-pw@hooks.example.com:8443/in/senddock?token=tok-999"
    with engine.begin() as conn:
        failing = event_queue.create_endpoint(conn, url=secret_url, secret=new_secret(),
                                              events=["sent"])
        gone = event_queue.create_endpoint(conn, url=secret_url + "&b=2", secret=new_secret(),
                                           events=["sent"])
        conn.execute(sa.text("""
            UPDATE webhook_endpoints SET failing_since = now() - interval '2 hours',
                   consecutive_failures = 40 WHERE id = :a"""), {"a": failing})
        conn.execute(sa.text("""
            UPDATE webhook_endpoints SET failing_since = now() - interval '3 days 1 hour',
                   disabled_at = now(), consecutive_failures = 900,
                   disabled_reason = 'HTTP 503' WHERE id = :b"""), {"b": gone})
    admin = Browser(app.test_client(), make_user("admin"))
    marketer = Browser(app.test_client(), make_user("marketer"))
    for headers, words in (({}, ("was disabled after answering no 2xx since",
                                 "has answered no 2xx since")),
                           ({"Accept-Language": "es"}, ("se desactivó tras no responder 2xx",
                                                        "no responde 2xx desde"))):
        health._alarm_cache.clear()
        page = admin.get("/", headers=headers).get_data(as_text=True)
        banner = page[page.index('id="alarms"'):page.index("<main>")]
        assert 'data-alarm="event_webhook_disabled"' in banner
        assert 'data-alarm="event_webhook_failing"' in banner
        assert all(w in banner for w in words), banner
        assert "https://hooks.example.com:8443/in/senddock" in banner
        assert "s3cr3t" not in banner and "tok-999" not in banner and "hook-user" not in banner
        shown = marketer.get("/", headers=headers).get_data(as_text=True)
        assert "event_webhook" not in shown and "hooks.example.com" not in shown


def test_display_url_keeps_only_scheme_host_port_and_path() -> None:
    assert event_queue.display_url("https://u:p@h.example:444/a/b?x=1#f") == \
        "https://h.example:444/a/b"
    assert event_queue.display_url("http://[::1]:8080/x?y") == "http://[::1]:8080/x"
    assert event_queue.display_url("http://h.example") == "http://h.example"
