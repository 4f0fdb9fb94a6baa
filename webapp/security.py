"""CSRF on every state-changing request, and the security headers (P10)."""

from __future__ import annotations

from flask import Flask, g, request
from flask_wtf.csrf import CSRFProtect
from werkzeug.wrappers import Response

csrf = CSRFProtect()

# No inline script or style: everything comes from /static.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'self'; "
       "object-src 'none'")


# Endpoints that accept uploads up to SENDDOCK_MAX_IMPORT_BYTES instead of
# SENDDOCK_MAX_REQUEST_BYTES (CSV imports).
UPLOAD_ENDPOINTS = frozenset({"lists.import_csv"})


def _csrf_unless_bearer() -> None:
    # API calls authenticated by a bearer token carry no ambient credentials, so CSRF
    # cannot apply to them; everything else (forms, HTMX, browser API use) is checked.
    auth = request.headers.get("Authorization", "")
    if request.path.startswith("/api/") and auth.lower().startswith("bearer "):
        return
    if request.endpoint == "public.unsubscribe_one_click":
        return  # RFC 8058: mail clients POST without a session; the signed URL is the proof
    csrf.protect()


def _headers(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
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

    @app.before_request
    def check_csrf() -> None:
        if request.endpoint in UPLOAD_ENDPOINTS:
            # Raised before the CSRF check parses the form (files are spooled to disk).
            request.max_content_length = app.extensions["senddock"].config.max_import_bytes
        if request.method in ("POST", "PUT", "PATCH", "DELETE"):
            _csrf_unless_bearer()

    app.after_request(_headers)
