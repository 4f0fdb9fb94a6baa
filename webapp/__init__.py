"""SendDock's web app: ``create_app()`` plugs every subsystem in, in one visible place."""

from __future__ import annotations

import logging
import threading
from typing import Any

from flask import Flask, Request
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface

from webapp import auth, db, errors, form_memory, formatting, i18n, nav, security
from webapp.json_input import JSONProvider, JSONRequest
from webapp.resources import resource_dir
from workers.core.settings import Config, load

log = logging.getLogger("senddock")


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, except that a request without the cookie (every API
    call with a token) gets a new empty session without building the cookie's signer:
    Flask's own ``open_session`` builds it first, about 3 % of a ``POST /messages``'s
    Python. With the cookie, or without a secret key, Flask's path as it is."""

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if app.secret_key and not request.cookies.get(self.get_cookie_name(app)):
            return self.session_class()
        return super().open_session(app, request)


class SendDock:
    """What the app holds for its lifetime (``app.extensions['senddock']``)."""

    def __init__(self, config: Config, engine: Any) -> None:
        self.config = config
        self.engine = engine
        self.pool: Any = None
        self._health: Any = None
        self._health_lock = threading.Lock()

    def health_probe(self) -> Any:
        """The process's :class:`webapp.dbhealth.HealthProbe` (made on first use)."""
        with self._health_lock:
            if self._health is None:
                from webapp.dbhealth import HealthProbe
                from workers.core import pg

                self._health = HealthProbe(pg.engine_conninfo(self.engine),
                                           self.config.extra.get("process", "web"))
            return self._health


def create_app(config: Config | None = None, *, engine: Any = None) -> Flask:
    config = config or load()
    app = Flask(__name__, template_folder=resource_dir("templates"),
                static_folder=resource_dir("static"))
    # Bad JSON of any shape (100,000 levels deep included) is a 400 saying why (P9).
    app.json = JSONProvider(app)
    app.request_class = JSONRequest
    # "a//b" is not silently redirected to "a/b": a DELETE of /suppressions/x//y@z would
    # otherwise answer an HTML 308 that changes its target.
    app.url_map.merge_slashes = False
    app.session_interface = _SessionInterface()
    if config.proxy_fix:
        # Behind one TLS-terminating proxy: request.is_secure, remote_addr (login limits)
        # and external URLs come from its X-Forwarded-* headers.
        from werkzeug.middleware.proxy_fix import ProxyFix

        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1, x_proto=1, x_host=1,  # type: ignore[method-assign]
                                x_port=1)
    app.config.update(
        SECRET_KEY=config.secret_key,
        MAX_CONTENT_LENGTH=config.max_request_bytes,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=config.secure_cookies,
        REMEMBER_COOKIE_SECURE=config.secure_cookies,
        REMEMBER_COOKIE_HTTPONLY=True,
        WTF_CSRF_TIME_LIMIT=None,
        TEMPLATES_AUTO_RELOAD=False,
    )
    if engine is None:
        url = db.resolve_url(config.database_url, config.data_dir)
        engine = db.web_engine(url, config, config.extra.get("process", "web"))
    app.extensions["senddock"] = SendDock(config, engine)

    from webapp.context import close_request_connection, page_ended, page_started

    app.before_request(page_started)  # first, so every page is counted from its start
    app.teardown_request(page_ended)
    app.teardown_request(close_request_connection)
    auth.init_app(app)
    security.init_app(app)
    errors.init_app(app)
    nav.init_app(app)
    formatting.init_app(app)
    i18n.init_app(app)
    form_memory.init_app(app)

    from webapp.blueprints import register_all

    register_all(app)
    return app


def senddock(app: Flask) -> SendDock:
    ext: SendDock = app.extensions["senddock"]
    return ext
