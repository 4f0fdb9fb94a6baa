"""Signed, unguessable links the engine puts into messages (SPEC 3, P10).

The engine builds them when it composes a message; the web app reads them back when a
recipient follows one. Both sides share only the secret key.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from itsdangerous import BadSignature, URLSafeSerializer

_UNSUBSCRIBE_SALT = "senddock-unsubscribe-v1"


def make_token(secret_key: str, subscriber_id: int, campaign_id: int | None) -> str:
    """A token naming the subscriber and campaign, signed with the secret key (HMAC)."""
    return URLSafeSerializer(secret_key, salt=_UNSUBSCRIBE_SALT).dumps(
        [subscriber_id, campaign_id])


def read_token(secret_key: str, token: str) -> tuple[int, int | None] | None:
    """(subscriber_id, campaign_id) for a genuine token; None for a forged or broken one."""
    try:
        value = URLSafeSerializer(secret_key, salt=_UNSUBSCRIBE_SALT).loads(token)
    except BadSignature:
        return None
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int)
            or not (value[1] is None or isinstance(value[1], int))):
        return None
    return value[0], value[1]


def unsubscribe_url(base_url: str, secret_key: str, subscriber_id: int,
                    campaign_id: int | None) -> str:
    return f"{base_url}/u/{make_token(secret_key, subscriber_id, campaign_id)}"


# --- VERP: the job in the envelope sender (SPEC 10, 12) ---------------------------------
# bounces+<job id>-<signature>@domain. Lower-case hex only: some MTAs change the case of
# the local part, and a bounce must still match. 16 hex digits of HMAC-SHA256 (64 bits)
# make a forged token for a job as likely as guessing one in 2**64.

_VERP_SALT = b"senddock-verp-v1"
_VERP_TOKEN = re.compile(r"([0-9a-z]+)-([0-9a-f]{16})")


def _verp_signature(secret_key: str, job_id: int) -> str:
    mac = hmac.new(secret_key.encode(), _VERP_SALT + b":" + str(job_id).encode(),
                   hashlib.sha256)
    return mac.hexdigest()[:16]


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def bounce_token(secret_key: str, job_id: int) -> str:
    """``<job id in base 36>-<16 hex of HMAC>``: names the job, unforgeable without the key,
    safe in an SMTP local part and unchanged by case-folding."""
    if job_id < 0:
        raise ValueError("job id must not be negative")
    return f"{_base36(job_id)}-{_verp_signature(secret_key, job_id)}"


def read_bounce_token(secret_key: str, token: str) -> int | None:
    """The job id of a genuine token (any case); None for a forged or malformed one."""
    match = _VERP_TOKEN.fullmatch(token.strip().lower())
    if match is None:
        return None
    job_id = int(match[1], 36)
    if not hmac.compare_digest(match[2], _verp_signature(secret_key, job_id)):
        return None
    return job_id


def verp_address(bounce_address: str, secret_key: str, job_id: int) -> str:
    """``bounces@example.com`` -> ``bounces+<token>@example.com`` for this job."""
    local, _, domain = bounce_address.rpartition("@")
    return f"{local}+{bounce_token(secret_key, job_id)}@{domain}"


def job_from_verp(address: str, secret_key: str, bounce_address: str | None = None) -> int | None:
    """The job a VERP address names (``bounces+<token>@domain``, any case), or None when it
    is not one of ours: wrong key, forged token, or (with ``bounce_address``) a different
    mailbox or domain."""
    local, _, domain = address.strip().strip("<>").rpartition("@")
    base, plus, token = local.partition("+")
    if not plus:
        return None
    if bounce_address is not None:
        want_local, _, want_domain = bounce_address.rpartition("@")
        if base.lower() != want_local.lower() or domain.lower() != want_domain.lower():
            return None
    return read_bounce_token(secret_key, token)
