"""A form refused after a redirect comes back as the person filled it in ("add
subscriber", "schedule", "add user", "add endpoint" and "generate key" came back empty).

The view that refuses a form calls :func:`remember` before redirecting (POST/redirect/GET
stays: a reload never posts again); the page the redirect lands on reads the values with
``kept_form(name)`` in its template, once. Secrets (passwords, the CSRF token) are never
kept. And :func:`show_once` carries a value to exactly one following page, sealed with the
app's secret key (the new API token after "Create token": the session is a signed but
readable cookie).
"""

from __future__ import annotations

import base64
import os

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flask import Flask, current_app, g, request, session

NEVER_KEPT = frozenset({"csrf_token", "password", "password_confirm", "current_password"})
MAX_VALUE = 4000  # a value longer than this is cut (the cookie has a size limit)


class KeptForm:
    """The values of the form named ``name`` if it was the one refused, else empty."""

    def __init__(self, values: dict[str, list[str]] | None) -> None:
        self.values = values or {}
        self.filled = values is not None

    def get(self, field: str, default: str = "") -> str:
        found = self.values.get(field)
        return found[0] if found else default

    def all(self, field: str) -> list[str]:
        return self.values.get(field, [])


def remember(form_name: str) -> None:
    """Keep this request's form (without secrets) for the next page that shows it."""
    session["kept_form"] = {
        "form": form_name,
        "values": {k: [v[:MAX_VALUE] for v in request.form.getlist(k)]
                   for k in request.form if k not in NEVER_KEPT}}


def kept_form(form_name: str) -> KeptForm:
    if "kept_form" not in g:
        g.kept_form = session.pop("kept_form", None)
    kept = g.kept_form
    return KeptForm(kept["values"] if kept and kept.get("form") == form_name else None)


def _aead() -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"senddock-show-once",
               info=b"show once v1").derive(str(current_app.secret_key).encode())
    return AESGCM(key)


def show_once(name: str, value: str) -> None:
    """Hand ``value`` to the next page that asks for it with :func:`take_shown`."""
    nonce = os.urandom(12)
    sealed = _aead().encrypt(nonce, value.encode(), name.encode())
    session[f"once_{name}"] = base64.b64encode(nonce + sealed).decode("ascii")


def take_shown(name: str) -> str | None:
    raw = session.pop(f"once_{name}", None)
    if not raw:
        return None
    data = base64.b64decode(raw)
    return _aead().decrypt(data[:12], data[12:], name.encode()).decode()


def init_app(app: Flask) -> None:
    app.jinja_env.globals["kept_form"] = kept_form
