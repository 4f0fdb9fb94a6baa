"""Request-time accessors for views: the engine, the config, who is acting."""

from __future__ import annotations

from typing import Any

from flask import current_app, g
from flask_login import current_user
from sqlalchemy.engine import Engine

from workers.core.settings import Config


def engine() -> Engine:
    eng: Engine = current_app.extensions["senddock"].engine
    return eng


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
