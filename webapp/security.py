"""CSRF on every state-changing request, and the security headers (P10)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Flask, g, request
from flask_wtf.csrf import CSRFProtect
from werkzeug.wrappers import Response

from webapp.domain.errors import Invalid

csrf = CSRFProtect()

# No inline script or style: everything comes from /static.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'self'; "
       "object-src 'none'")


# Methods that never change anything: everything else is CSRF-checked (when it reaches a
# view: a route answers only the methods it declares, 405 otherwise).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class _UnsafeMethods:
    """Flask-WTF's ``WTF_CSRF_METHODS``: every method but the safe ones (it only tests
    ``method in``), so a method no list names is checked too."""

    def __contains__(self, method: object) -> bool:
        return method not in SAFE_METHODS

    def __iter__(self) -> Iterator[str]:
        return iter(("POST", "PUT", "PATCH", "DELETE"))


class HeadAsGet:
    """WSGI wrapper: a HEAD request is answered as the same GET would be, without its
    body, and nothing it sends is read. The view sees a GET with no body (no form, no
    upload, no JSON), so it cannot take the write path whatever it tests; the answer's
    status and headers (Content-Length included) are the GET's (RFC 9110 9.3.2)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return self.app(environ, start_response)
        environ = dict(environ)
        environ["REQUEST_METHOD"] = "GET"
        environ["senddock.head"] = True
        environ["CONTENT_LENGTH"] = "0"
        environ.pop("CONTENT_TYPE", None)
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        environ["wsgi.input"] = io.BytesIO(b"")
        environ["wsgi.input_terminated"] = True
        body = self.app(environ, start_response)
        close = getattr(body, "close", None)
        if close is not None:
            close()
        return []


# Endpoints that accept uploads up to SENDDOCK_MAX_IMPORT_BYTES instead of
# SENDDOCK_MAX_REQUEST_BYTES (CSV imports).
UPLOAD_ENDPOINTS = frozenset({"lists.import_csv"})


# Public POSTs that use no session and carry their own proof instead of the session's CSRF
# token: the subscription form (a signed form token), the confirmation button (the signed
# link) and the public subscribe API (JSON, no cookies read; answers the same either way).
SIGNED_PUBLIC_POSTS = frozenset({"public.subscribe_submit", "public.subscribe_confirm_post",
                                 "api.subscribe"})


def _csrf_unless_bearer() -> None:
    # API calls authenticated by a bearer token carry no ambient credentials, so CSRF
    # cannot apply to them; everything else (forms, HTMX, browser API use) is checked.
    auth = request.headers.get("Authorization", "")
    if request.path.startswith("/api/") and auth.lower().startswith("bearer "):
        return
    if request.endpoint == "public.unsubscribe_one_click":
        return  # RFC 8058: mail clients POST without a session; the signed URL is the proof
    if request.endpoint in SIGNED_PUBLIC_POSTS:
        return  # no session: each carries its own signed proof (docs/security.md)
    if (request.endpoint or "").startswith("webhooks."):
        return  # providers POST without a session; each request carries its own proof
    csrf.protect()


def _unstorable(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` (its text type refuses NUL and invalid
    Unicode), or None."""
    if "\x00" in text:
        return "must not contain a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode"
    return None


def _find_unstorable(value: Any, where: str) -> tuple[str, str] | None:
    """The first (field path, reason) in a JSON value whose text cannot be stored."""
    if isinstance(value, str):
        reason = _unstorable(value)
        return (where, reason) if reason else None
    items: Any = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in items:
        path = f"{where}.{key}" if where else str(key)
        found = _find_unstorable(str(key), path) or _find_unstorable(item, path)
        if found:
            return found
    return None


def _plain_json_body() -> bool:
    """True when the request's JSON body cannot hold text the database refuses, judged
    from its bytes: a parsed string can hold a NUL or a lone surrogate only through a
    ``\\u`` escape (JSON refuses raw control characters) or raw encoded surrogates
    (``json`` decodes with ``surrogatepass``: refused here by the strict decode), and a
    body with no NUL byte is not UTF-16 or UTF-32, so has no escape hidden from this
    search. The API's bodies skip the walk."""
    data = request.get_data(cache=True)
    if b"\\u" in data or b"\x00" in data:
        return False
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _text_inputs() -> Iterator[tuple[str, Any]]:
    """(name, value) of every input a view may read: path, query, form or JSON body."""
    yield from (request.view_args or {}).items()
    yield from request.args.items(multi=True)
    if request.method not in SAFE_METHODS:
        if request.is_json:
            if not _plain_json_body():
                yield "", request.get_json(silent=True)
        elif request.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
            yield from request.form.items(multi=True)


def refuse_unstorable_text() -> None:
    """Bad input gets a clear answer (P9): text the database cannot store (NUL bytes,
    lone surrogates) in the path, the query, a form or a JSON body is a 422 naming the
    field, before any view runs."""
    for name, value in _text_inputs():
        found = _find_unstorable(name, name) or _find_unstorable(value, name)
        if found:
            field, reason = found
            field = field or "body"
            raise Invalid(f"{field} {reason}", fields={field: reason})


def _headers(response: Response) -> Response:
    if g.get("frameable"):  # a public subscription form, embeddable by any site
        response.headers.setdefault("Content-Security-Policy", CSP.replace(
            "frame-ancestors 'none'", "frame-ancestors *"))
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    if not g.get("frameable"):
        response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
    if request.is_secure:
        response.headers.setdefault("Strict-Transport-Security",
                                    "max-age=31536000; includeSubDomains")
    if g.get("no_store") or request.path.startswith("/api/"):
        response.headers.setdefault("Cache-Control", "no-store")
    return response


def init_app(app: Flask) -> None:
    app.config["WTF_CSRF_CHECK_DEFAULT"] = False
    csrf.init_app(app)
    app.config["WTF_CSRF_METHODS"] = _UnsafeMethods()
    app.wsgi_app = HeadAsGet(app.wsgi_app)  # type: ignore[method-assign]

    @app.before_request
    def check_csrf() -> None:
        if request.endpoint in UPLOAD_ENDPOINTS:
            # Raised before the CSRF check parses the form (files are spooled to disk).
            request.max_content_length = app.extensions["senddock"].config.max_import_bytes
        if request.method not in SAFE_METHODS:
            _csrf_unless_bearer()

    app.before_request(refuse_unstorable_text)
    app.after_request(_headers)
