"""Request-time accessors for views: the engine, the config, who is acting."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import current_app, g
from flask_login import current_user
from sqlalchemy.engine import Connection, Engine

from workers.core.settings import Config


def engine() -> Engine:
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
        conn = engine().connect().execution_options(isolation_level="AUTOCOMMIT")
        g._autocommit_conn = conn
    yield conn


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
