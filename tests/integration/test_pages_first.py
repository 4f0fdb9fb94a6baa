"""Pages ahead of campaign mail in serve (workers.delivery.foreground): while a
page is being answered, a delivery thread waits before its next campaign message (at most
LONGEST_WAIT each time); transactional mail never waits; the API, tracking, webhooks,
health probes and static files are not pages."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import Api, wait_for
from tests.integration.test_verifications_priority import accepted_lines, queue_campaign
from workers import queue
from workers.core.settings import Config
from workers.delivery.foreground import Foreground
from workers.delivery.pool import Pool


def test_with_no_page_open_a_delivery_thread_does_not_wait() -> None:
    foreground = Foreground(longest=60)
    assert foreground.give_way() == 0.0
    foreground.enter()
    foreground.leave()
    assert foreground.give_way() == 0.0


def test_a_delivery_thread_waits_until_the_page_is_answered() -> None:
    foreground = Foreground(longest=60)
    foreground.enter()
    waiting, done = threading.Event(), threading.Event()

    def deliver() -> None:
        waiting.set()
        foreground.give_way()
        done.set()

    thread = threading.Thread(target=deliver)
    thread.start()
    assert waiting.wait(10)
    assert not done.wait(0.2), "gave way for less than the page took"
    foreground.leave()
    assert done.wait(10), "still waiting after the page was answered"
    thread.join()


def test_pages_back_to_back_slow_the_drain_but_never_stop_it() -> None:
    foreground = Foreground(longest=0.01)
    foreground.enter()  # a page that is never answered
    for _ in range(3):
        assert foreground.give_way() >= 0.01
    foreground.leave()


class _Counting(Foreground):
    def __init__(self) -> None:
        super().__init__()
        self.entered = self.left = 0

    def enter(self) -> None:
        self.entered += 1
        super().enter()

    def leave(self) -> None:
        self.left += 1
        super().leave()


class _Pool:
    def __init__(self) -> None:
        self.foreground = _Counting()

    def behind(self) -> bool:
        return False


def test_pages_are_counted_and_machine_requests_are_not(app: Any, client: Any,
                                                        api: Api) -> None:
    pool = _Pool()
    app.extensions["senddock"].pool = pool
    try:
        for path in ("/login", "/subscribe/999999"):  # a page, and a page's 404
            before = pool.foreground.entered
            client.get(path)
            assert pool.foreground.entered == before + 1, path
        assert api.get("/kinds").status_code == 200
        for path in ("/healthz", "/static/favicon.svg", "/no/such/path"):
            client.get(path)
        assert pool.foreground.entered == 2
        assert pool.foreground.left == pool.foreground.entered
    finally:
        app.extensions["senddock"].pool = None


def test_campaign_mail_waits_for_the_page_and_a_verification_does_not(
        engine: sa.Engine, sink: Any, api: Api,
        config_for: Callable[..., Config]) -> None:
    broadcast_id = queue_campaign(engine, 40)
    r = api.post("/verifications", {"user_id": "first", "email": "first@example.net",
                                    "verify_url": "https://app.example/verify?t=first"})
    assert r.status_code == 202
    pool = Pool(engine, config_for(sink.port), node="pages-first")
    pool.foreground.longest = 120  # a page that takes its time
    pool.foreground.enter()
    pool.start()
    left = False
    try:
        wait_for(lambda: b"first@example.net" in b"".join(accepted_lines(sink)), timeout=60,
                 message="the verification at the sink while a page is open")
        with engine.connect() as conn:
            assert queue.broadcast_counts(conn, broadcast_id)["sent"] == 0
        assert len(accepted_lines(sink)) == 1
        pool.foreground.leave()
        left = True
        wait_for(lambda: len(accepted_lines(sink)) == 41, timeout=60,
                 message="the campaign once the page was answered")
    finally:
        if not left:
            pool.foreground.leave()
        pool.stop(timeout=30)
