"""Single sign-on with OpenID Connect (Authlib): the authorization code flow with PKCE
(S256), state and nonce kept in the session and checked once, and the ID token's
signature (the provider's JWKS), issuer, audience and expiry verified by Authlib.

The role comes from a claim (``SENDDOCK_OIDC_ROLE_CLAIM``, e.g. groups) through the table
``SENDDOCK_OIDC_ROLE_MAP``; a sign-in whose claim maps to no role is refused. A first
sign-in creates the user when ``SENDDOCK_OIDC_CREATE_USERS`` is on.
"""

from __future__ import annotations

import secrets
from typing import Any

import requests
import sqlalchemy as sa
from authlib.integrations.base_client import OAuthError
from authlib.integrations.flask_client import OAuth
from flask import current_app
from joserfc.errors import JoseError
from sqlalchemy.engine import Connection

from webapp.domain import audit, users
from webapp.domain.errors import DomainError
from workers.core.i18n import N_
from workers.core.settings import Config

# What a failed exchange raises: state or provider errors (Authlib), an ID token that is
# not valid (signature, issuer, audience, expiry, nonce: joserfc), the provider unreachable.
FAILURES: tuple[type[Exception], ...] = (OAuthError, JoseError, requests.RequestException,
                                         ValueError, KeyError)


class SignInRefused(DomainError):
    status = 403


def enabled(config: Config) -> bool:
    return bool(config.oidc_issuer)


def client(config: Config) -> Any:
    """The app's Authlib client for the provider (registered on first use)."""
    oauth: OAuth | None = current_app.extensions.get("senddock_oidc")
    if oauth is None:
        oauth = OAuth(current_app)
        oauth.register(
            "provider", client_id=config.oidc_client_id,
            client_secret=config.oidc_client_secret,
            server_metadata_url=f"{config.oidc_issuer}/.well-known/openid-configuration",
            client_kwargs={"scope": f"openid email {config.oidc_role_claim}",
                           "code_challenge_method": "S256", "timeout": 10})
        current_app.extensions["senddock_oidc"] = oauth
    return oauth.provider


LEEWAY_SECONDS = 60  # clock difference allowed on the ID token's exp, iat and nbf


def claims_options(config: Config) -> dict[str, Any]:
    """What the ID token must say: issued by the configured issuer, to this client (Authlib
    checks the audience only when told), and when it expires."""
    return {"iss": {"essential": True, "values": [config.oidc_issuer]},
            "aud": {"essential": True, "values": [config.oidc_client_id]},
            "exp": {"essential": True}, "sub": {"essential": True}}


def redirect_uri(config: Config) -> str:
    return f"{config.base_url.rstrip('/')}/login/sso/callback"


def role_for(config: Config, claims: dict[str, Any]) -> str | None:
    """The role the claim maps to (the first pair of the table the claim holds)."""
    value = claims.get(config.oidc_role_claim)
    held = {str(v) for v in value} if isinstance(value, list) else \
        ({str(value)} if value is not None else set())
    return next((role for wanted, role in config.oidc_role_map if wanted in held), None)


def sso_only(config: Config, email: str) -> bool:
    """Whether ``email``'s domain must sign in through the provider (password refused)."""
    return email.rsplit("@", 1)[-1].strip().lower() in config.sso_only_domains


def user_for(conn: Connection, config: Config, claims: dict[str, Any],
             remote_addr: str) -> dict[str, Any]:
    """The SendDock user for a verified ID token's claims, with the mapped role (a role
    that changed at the provider is updated); created when allowed; else refused."""
    email = str(claims.get("email") or "").strip()
    if not email or claims.get("email_verified") is False:
        raise SignInRefused(N_("the identity provider gave no verified email address"))
    role = role_for(config, claims)
    if role is None:
        audit.record(conn, email, "user.login_failed", email.lower(), remote_addr=remote_addr,
                     reason="single sign-on: no role for the claim")
        raise SignInRefused(N_("your identity provider account has no SendDock role "
                               "(claim %(claim)s): ask an admin", claim=config.oidc_role_claim))
    user = users.find_user(conn, email)
    if user is None:
        if not config.oidc_create_users:
            raise SignInRefused(N_("there is no SendDock user %(email)s: ask an admin",
                                   email=email))
        # Their password is random and never shown: they sign in through the provider.
        users.create_user(conn, email, secrets.token_urlsafe(32), role,
                          actor="single sign-on")
        user = users.find_user(conn, email)
        assert user is not None
    if not user["active"]:
        raise SignInRefused(N_("this user is disabled"))
    if user["role"] != role:
        try:  # audited; never leaves SendDock without an active admin
            user = {**user, **users.update_role(conn, int(user["id"]), role,
                                                actor="single sign-on")}
        except DomainError as exc:
            raise SignInRefused(exc.message) from exc
    conn.execute(sa.text("UPDATE users SET last_login_at = now() WHERE id = :id"),
                 {"id": user["id"]})
    audit.record(conn, user["email"], "user.login", f"user:{user['id']}",
                 remote_addr=remote_addr, via="single sign-on")
    return user
