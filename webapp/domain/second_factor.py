"""Two-factor authentication with TOTP (RFC 6238, ``pyotp``): enrolment, checks with replay
refused, single-use recovery codes, roles that require it, and an admin's reset.

The secret is stored sealed (AES-GCM, a key derived from ``SENDDOCK_SECRET_KEY``): a copy of
the database alone does not give the codes. Recovery codes are stored as SHA-256 hashes
(each carries 80 random bits: nothing to brute-force). A code's time step is remembered, so
a code seen once (or an older one) is refused afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import time
from typing import Any

import pyotp
import segno
import sqlalchemy as sa
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy.engine import Connection

from webapp.domain import audit
from webapp.domain.errors import Invalid, NotFound
from webapp.models import ROLES
from workers.core.i18n import N_

ISSUER = "SendDock"
STEP_SECONDS = 30
RECOVERY_CODES = 10
_CODE = re.compile(r"^\d{6}$")
_RECOVERY_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I


class CodeRefused(Invalid):
    """A wrong, replayed or malformed code."""


def _aead(secret_key: str) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"senddock-totp",
               info=b"totp secret v1").derive(secret_key.encode())
    return AESGCM(key)


def seal(secret_key: str, value: str, *, purpose: str = "totp") -> str:
    nonce = os.urandom(12)
    return base64.b64encode(nonce + _aead(secret_key).encrypt(
        nonce, value.encode(), purpose.encode())).decode("ascii")


def unseal(secret_key: str, sealed: str, *, purpose: str = "totp") -> str:
    data = base64.b64decode(sealed)
    return _aead(secret_key).decrypt(data[:12], data[12:], purpose.encode()).decode()


def new_secret() -> str:
    return pyotp.random_base32()


def provisioning_uri(secret: str, email: str) -> str:
    return pyotp.TOTP(secret).provisioning_uri(name=email, issuer_name=ISSUER)


def qr_svg(uri: str) -> str:
    """The ``otpauth://`` URI as an inline SVG QR code (no image request, no script)."""
    return str(segno.make(uri, error="m").svg_inline(scale=4, title="QR code"))


def _matching_step(secret: str, code: str, now: float | None = None) -> int | None:
    """The time step (one before or after now allowed for clock drift) ``code`` is right
    for, or None."""
    code = re.sub(r"\s", "", code)
    if not _CODE.match(code):
        return None
    totp = pyotp.TOTP(secret)
    current = int((time.time() if now is None else now) // STEP_SECONDS)
    for step in (current - 1, current, current + 1):
        if hmac.compare_digest(totp.generate_otp(step), code):
            return step
    return None


def _recovery_hash(code: str) -> str:
    return hashlib.sha256(re.sub(r"[\s-]", "", code).upper().encode()).hexdigest()


def _new_recovery_code() -> str:
    raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(16))  # 80 bits
    return "-".join(raw[i:i + 4] for i in range(0, 16, 4))


def enrol(conn: Connection, user_id: int, secret_key: str, secret: str, code: str, *,
          actor: str) -> list[str]:
    """Turn two-factor on with ``secret`` once ``code`` proves the authenticator has it;
    returns the ten recovery codes (shown once, only their hashes are kept)."""
    step = _matching_step(secret, code)
    if step is None:
        raise CodeRefused(N_("that code is not the one your authenticator shows now: "
                             "two-factor is not turned on"),
                          fields={"code": N_("wrong code")})
    n = conn.execute(sa.text("""
        UPDATE users SET totp_secret = :s, totp_enabled_at = now(), totp_last_step = :t
         WHERE id = :id"""), {"s": seal(secret_key, secret), "t": step, "id": user_id}
    ).rowcount
    if not n:
        raise NotFound(N_("user %(id)s does not exist", id=str(user_id)))
    codes = new_recovery_codes(conn, user_id)
    audit.record(conn, actor, "user.second_factor_enrol", f"user:{user_id}")
    return codes


def new_recovery_codes(conn: Connection, user_id: int) -> list[str]:
    """Replace the user's recovery codes with ten new ones (returned, hashed in the DB)."""
    codes = [_new_recovery_code() for _ in range(RECOVERY_CODES)]
    conn.execute(sa.text("DELETE FROM recovery_codes WHERE user_id = :u"), {"u": user_id})
    conn.execute(sa.text("INSERT INTO recovery_codes (user_id, code_hash) VALUES (:u, :h)"),
                 [{"u": user_id, "h": _recovery_hash(c)} for c in codes])
    return codes


def verify(conn: Connection, user_id: int, secret_key: str, code: str) -> str:
    """Check a code from the authenticator or a recovery code; returns ``"totp"`` or
    ``"recovery"``, else raises :class:`CodeRefused`. A TOTP code's step must be newer than
    the last accepted one (a replayed code is refused); a recovery code works once."""
    row = conn.execute(sa.text("SELECT totp_secret, totp_last_step FROM users WHERE id = :id "
                               "FOR UPDATE"), {"id": user_id}).mappings().first()
    if row is None or row["totp_secret"] is None:
        raise CodeRefused(N_("two-factor is not turned on for this account"))
    compact = re.sub(r"\s", "", code)
    if _CODE.match(compact):
        step = _matching_step(unseal(secret_key, row["totp_secret"]), compact)
        if step is not None:
            if row["totp_last_step"] is not None and step <= row["totp_last_step"]:
                raise CodeRefused(N_("that code was used already: wait for the next one"),
                                  fields={"code": N_("used already")})
            conn.execute(sa.text("UPDATE users SET totp_last_step = :t WHERE id = :id"),
                         {"t": step, "id": user_id})
            return "totp"
    elif compact:
        used = conn.execute(sa.text("""
            UPDATE recovery_codes SET used_at = now()
             WHERE user_id = :u AND code_hash = :h AND used_at IS NULL RETURNING id"""),
            {"u": user_id, "h": _recovery_hash(compact)}).first()
        if used is not None:
            audit.record(conn, f"user:{user_id}", "user.recovery_code_used", f"user:{user_id}")
            return "recovery"
    raise CodeRefused(N_("wrong code"), fields={"code": N_("wrong code")})


def status(conn: Connection, user_id: int) -> dict[str, Any]:
    row = conn.execute(sa.text("""
        SELECT u.totp_enabled_at,
               (SELECT count(*) FROM recovery_codes r
                 WHERE r.user_id = u.id AND r.used_at IS NULL) AS recovery_left,
               EXISTS (SELECT 1 FROM second_factor_roles s WHERE s.role = u.role) AS required
          FROM users u WHERE u.id = :id"""), {"id": user_id}).mappings().first()
    if row is None:
        raise NotFound(N_("user %(id)s does not exist", id=str(user_id)))
    return dict(row)


def reset(conn: Connection, user_id: int, *, actor: str) -> None:
    """An admin turns someone's second factor off (a lost phone): secret and recovery
    codes go, their sessions end; audited. They enrol again (at their next login when
    their role requires it)."""
    n = conn.execute(sa.text("""
        UPDATE users SET totp_secret = NULL, totp_enabled_at = NULL, totp_last_step = NULL,
                         session_version = session_version + 1
         WHERE id = :id AND totp_enabled_at IS NOT NULL"""), {"id": user_id}).rowcount
    if not n:
        raise NotFound(N_("user %(id)s has no second factor to reset", id=str(user_id)))
    conn.execute(sa.text("DELETE FROM recovery_codes WHERE user_id = :u"), {"u": user_id})
    conn.execute(sa.text("DELETE FROM web_sessions WHERE user_id = :u"), {"u": user_id})
    audit.record(conn, actor, "user.second_factor_reset", f"user:{user_id}")


def required_roles(conn: Connection) -> set[str]:
    return set(conn.execute(sa.text("SELECT role FROM second_factor_roles")).scalars())


def set_required_roles(conn: Connection, roles: Any, *, actor: str) -> list[str]:
    chosen = sorted(set(roles))
    unknown = [r for r in chosen if r not in ROLES]
    if unknown:
        raise Invalid(N_("role must be one of %(choices)s", choices=", ".join(ROLES)),
                      fields={"roles": N_("unknown role")})
    conn.execute(sa.text("DELETE FROM second_factor_roles WHERE NOT (role = ANY(:r))"),
                 {"r": chosen})
    conn.execute(sa.text("INSERT INTO second_factor_roles (role) SELECT unnest(CAST(:r AS "
                         "text[])) ON CONFLICT DO NOTHING"), {"r": chosen})
    audit.record(conn, actor, "user.second_factor_roles", "", roles=chosen)
    return chosen
