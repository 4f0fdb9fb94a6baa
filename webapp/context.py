"""Request-time accessors for views: the engine, the config, who is acting."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import current_app, g, has_request_context, request
from flask_login import current_user
from sqlalchemy.engine import Connection, Engine

from workers.core.settings import Config


def engine() -> Engine:
    """The process's engine. A view that takes its own connection from it first gives
    back the request's connection (the token check's, :func:`request_connection`) when
    nothing is using it: a request holds at most one pooled connection, so as many
    requests as there are pooled connections never wait on each other's (a request
    thread holding one while waiting for a second, with every other thread doing the
    same, waits out the pool's timeout)."""
    if has_request_context() and not g.get("_autocommit_busy"):
        close_request_connection()
    eng: Engine = current_app.extensions["senddock"].engine
    return eng


@contextmanager
def request_connection() -> Iterator[Connection]:
    """The request's connection in autocommit, for the one-statement paths (the token
    check and the transactional API): each statement commits on its own, with no BEGIN and
    COMMIT round trips, and the token check and the view share one checkout (one pool
    pre-ping). Returned to the pool when the request ends (:func:`close_request_connection`).
    A path that needs several statements to be atomic uses ``engine().begin()``."""
    conn = g.get("_autocommit_conn")
    if conn is None:
        eng: Engine = current_app.extensions["senddock"].engine
        conn = eng.connect().execution_options(isolation_level="AUTOCOMMIT")
        g._autocommit_conn = conn
    busy = g.get("_autocommit_busy", False)
    g._autocommit_busy = True
    try:
        yield conn
    finally:
        g._autocommit_busy = busy


# Seconds an API request that queues new mail waits while this process's delivery threads
# are behind (workers.delivery.pool.Pool.behind).
PACE = 0.02


def yield_to_delivery() -> None:
    """Before accepting more mail: while the delivery threads of this process (serve)
    are behind -- transactional mail waited longer than the pool's BEHIND_LAG before it
    was claimed -- wait :data:`PACE` seconds first. Request threads and delivery threads
    share one interpreter lock; on a busy machine the request threads, each wanting the
    CPU for a whole request, crowd out the delivery threads, which want it many times
    per message for a moment, and accepted mail queues up (P7). The wait holds no CPU,
    so mail already accepted goes out first. A web process without a pool never waits."""
    pool = current_app.extensions["senddock"].pool
    if pool is not None and pool.behind():
        time.sleep(PACE)


# Requests machines send, at any volume: they do not hold up campaign mail.
MACHINE_BLUEPRINTS = frozenset({"api", "tracking", "webhooks", "ops"})


def page_started() -> None:
    """A page (not the API, tracking, webhooks, health probes or a static file) is being
    answered by a process that also delivers (serve): its campaign messages give way until
    it is done (:mod:`workers.delivery.foreground`). Paired with :func:`page_ended`."""
    pool = current_app.extensions["senddock"].pool
    if pool is None or request.endpoint in (None, "static") \
            or request.blueprint in MACHINE_BLUEPRINTS:
        return
    pool.foreground.enter()
    g._foreground = pool.foreground


def page_ended(_exc: BaseException | None = None) -> None:
    foreground = g.pop("_foreground", None)
    if foreground is not None:
        foreground.leave()


def close_request_connection(_exc: BaseException | None = None) -> None:
    conn = g.pop("_autocommit_conn", None)
    if conn is not None:
        conn.close()


def config() -> Config:
    cfg: Config = current_app.extensions["senddock"].config
    return cfg


def actor() -> str:
    """Who is acting, for the audit log: the user's email (API: ``email (token N)``)."""
    api_user: dict[str, Any] | None = g.get("api_user")
    if api_user is not None:
        return f"{api_user['email']} (token {api_user['token_id']})"
    if current_user.is_authenticated:
        return str(current_user.email)
    return "anonymous"


def role() -> str:
    api_user: dict[str, Any] | None = g.get("api_user")
    if api_user is not None:
        return str(api_user["role"])
    if current_user.is_authenticated:
        return str(current_user.role)
    return "anonymous"
