"""DKIM (RFC 6376) signing per From domain, with keys stored encrypted in PostgreSQL.

Signing goes through ``cryptography`` (OpenSSL) rather than dkimpy's pure-Python RSA:
``bench/bench_dkim.py`` measured dkimpy at several milliseconds of CPU per message, which
would cap the drain far below docs/design.md §27's 1,000 msgs/s; the canonicalisation here is the
relaxed/relaxed one of RFC 6376 section 3.4 and the tests check every signature with
dkimpy's verifier (and OpenDKIM) against a real DNS server.

Keys: RSA-2048 (``rsa-sha256``, what every receiver verifies) and ed25519
(``ed25519-sha256``, RFC 8463: small and fast, but Gmail does not verify it yet, so an
ed25519 key alone does not satisfy Gmail -- sign with both). Private keys are encrypted with
AES-256-GCM under a key derived (HKDF-SHA256) from ``SENDDOCK_SECRET_KEY``; the domain and
selector are the associated data, so a ciphertext copied to another row does not decrypt.

Rotation uses two selectors per domain and algorithm: a new key starts as ``next``
(publish its record), becomes ``active`` when an admin activates it, and the key it
replaces becomes ``retired`` -- keep its record published a few days so mail in flight
still verifies, then delete it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.utils import parseaddr
from typing import Any

import sqlalchemy as sa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy.engine import Connection, Engine

from workers.core.addresses import domain_of
from workers.core.i18n import N_, Text, word

log = logging.getLogger(__name__)

ALGORITHMS = ("rsa", "ed25519")
STATUSES = ("next", "active", "retired")
SELECTORS = ("sd1", "sd2")  # the two selectors a domain rotates between (per algorithm)
_SIG_ALGORITHM = {"rsa": b"rsa-sha256", "ed25519": b"ed25519-sha256"}
_SELECTOR = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}"
                       r"[a-z0-9])?)*")
_DOMAIN = re.compile(r"(?=.{1,253}$)(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+"
                     r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")

# RFC 6376 section 5.4.1's list, plus List-Unsubscribe-Post (RFC 8058 requires it signed)
# and the headers Gmail's bulk-sender rules name. A header is signed as often as it occurs.
SIGNED_HEADERS: tuple[bytes, ...] = (
    b"from", b"reply-to", b"subject", b"date", b"to", b"cc", b"message-id",
    b"in-reply-to", b"references", b"mime-version", b"content-type",
    b"content-transfer-encoding", b"list-id", b"list-help", b"list-unsubscribe",
    b"list-unsubscribe-post", b"list-subscribe", b"list-post", b"list-owner",
    b"list-archive", b"auto-submitted", b"feedback-id",
)
# Signed once more than they occur ("oversigning"): a relay or attacker cannot add a second
# instance without breaking the signature (a second From is the classic spoofing trick).
OVERSIGNED = frozenset({b"from", b"subject", b"to", b"date", b"message-id", b"reply-to",
                        b"list-unsubscribe", b"list-unsubscribe-post", b"mime-version",
                        b"content-type"})

_WSP_RUN = re.compile(rb"[ \t]+")
_WSP_BEFORE_EOL = re.compile(rb" (?=\r\n)")
_LINE_END = re.compile(rb"\r\n|\r|\n")
_FIELD_START = re.compile(rb"^(?=[^ \t])", re.M)


def _unknown_algorithm(algorithm: str) -> Text:
    return N_("unknown DKIM algorithm %(algorithm)s (choose rsa or ed25519)",
              algorithm=repr(algorithm))


class DkimError(Exception):
    """A DKIM key or request SendDock cannot use; the message says what to do."""


class KeyDecryptError(DkimError):
    """A stored private key that the current SENDDOCK_SECRET_KEY does not decrypt."""


# -- keys --------------------------------------------------------------------


PrivateKey = rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


def generate_private_key(algorithm: str) -> PrivateKey:
    """A new RSA-2048 (e=65537) or ed25519 private key."""
    if algorithm == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if algorithm == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise DkimError(_unknown_algorithm(algorithm))


def private_bytes(key: PrivateKey) -> bytes:
    """The private key as unencrypted PKCS#8 DER (encrypted before it is stored)."""
    return key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def load_private_key(der: bytes) -> PrivateKey:
    key = serialization.load_der_private_key(der, password=None)
    if not isinstance(key, rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey):
        raise DkimError("stored DKIM key is neither RSA nor ed25519")
    return key


def public_key_b64(key: PrivateKey) -> str:
    """The ``p=`` value: base64 of the SubjectPublicKeyInfo DER for RSA (RFC 6376 3.6.1),
    of the raw 32-byte public key for ed25519 (RFC 8463 section 4)."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        raw = key.public_key().public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw)
    else:
        raw = key.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(raw).decode("ascii")


def _aead(secret_key: str) -> AESGCM:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"senddock-dkim",
                   info=b"dkim private keys v1").derive(secret_key.encode("utf-8"))
    return AESGCM(derived)


def _associated(domain: str, selector: str) -> bytes:
    return f"{domain}\x00{selector}".encode()


def encrypt_private_key(secret_key: str, domain: str, selector: str, der: bytes) -> str:
    """``v1.<base64(nonce + AES-GCM ciphertext)>``, bound to this domain and selector."""
    nonce = os.urandom(12)
    sealed = _aead(secret_key).encrypt(nonce, der, _associated(domain, selector))
    return "v1." + base64.b64encode(nonce + sealed).decode("ascii")


def decrypt_private_key(secret_key: str, domain: str, selector: str, stored: str) -> bytes:
    """The PKCS#8 DER back; raises KeyDecryptError if the secret key (or row) is not the one
    it was encrypted with."""
    version, _, payload = stored.partition(".")
    if version != "v1":
        raise KeyDecryptError(f"unknown key encryption format {version!r}")
    raw = base64.b64decode(payload)
    try:
        return _aead(secret_key).decrypt(raw[:12], raw[12:], _associated(domain, selector))
    except InvalidTag:
        raise KeyDecryptError(
            f"the DKIM key {selector}._domainkey.{domain} cannot be decrypted with the "
            "current SENDDOCK_SECRET_KEY (was the secret key changed?): restore the old "
            "secret key, or create a new key and publish its record") from None


def dns_value(algorithm: str, public_b64: str) -> str:
    """The TXT record's value exactly as it must be published."""
    return f"v=DKIM1; k={algorithm}; p={public_b64}"


def zone_line(domain: str, selector: str, value: str) -> str:
    """The record as a zone-file line, the value split in 255-byte strings (RFC 1035: a TXT
    character-string holds at most 255 bytes; an RSA-2048 record needs two)."""
    chunks = [value[i:i + 255] for i in range(0, len(value), 255)]
    quoted = " ".join(f'"{chunk}"' for chunk in chunks)
    return f"{selector}._domainkey.{domain}. 3600 IN TXT ( {quoted} )"


def normalize_domain(domain: str) -> str:
    """A lower-case ASCII (IDNA) domain; raises DkimError naming the problem."""
    value = domain.strip().rstrip(".").lower()
    try:
        value = value.encode("idna").decode("ascii")
    except UnicodeError:
        raise DkimError(N_("%(domain)s is not a valid domain name", domain=repr(domain))) \
            from None
    if not _DOMAIN.fullmatch(value):
        raise DkimError(N_("%(domain)s is not a valid domain name", domain=repr(domain)))
    return value


def check_selector(selector: str) -> str:
    value = selector.strip().lower()
    if not _SELECTOR.fullmatch(value) or len(value) > 63:
        raise DkimError(N_("%(selector)s is not a valid selector (letters, digits and "
                           "hyphens)", selector=repr(selector)))
    return value


# -- signing -----------------------------------------------------------------


@dataclass(frozen=True)
class SigningKey:
    """One usable key: ``d=domain``, ``s=selector``."""

    domain: str
    selector: str
    algorithm: str
    key: PrivateKey

    def sign_digest_input(self, data: bytes) -> bytes:
        if isinstance(self.key, ed25519.Ed25519PrivateKey):
            # RFC 8463 section 3: Ed25519 signs the SHA-256 hash of the canonical headers.
            return self.key.sign(hashlib.sha256(data).digest())
        return self.key.sign(data, padding.PKCS1v15(), hashes.SHA256())


def canonical_body(body: bytes) -> bytes:
    """RFC 6376 3.4.4 relaxed body: WSP runs to one SP, no WSP before a CRLF, no trailing
    empty lines, a final CRLF unless the body is empty (byte for byte what dkimpy and
    OpenDKIM compute; the tests compare)."""
    # The regular expressions run only when they can change something: most bodies
    # (quoted-printable from workers.building.message) have neither tabs, double spaces nor WSP at a
    # line end, and the substring tests are several times cheaper than a regex pass.
    if b"\t" in body or b"  " in body:
        body = _WSP_RUN.sub(b" ", body)
    if b" \r\n" in body:
        body = _WSP_BEFORE_EOL.sub(b"", body)
    end = len(body)
    while body.endswith(b"\r\n", 0, end):
        end -= 2
    return body[:end] + b"\r\n" if end else b""


def canonical_header(name: bytes, value: bytes) -> bytes:
    """RFC 6376 3.4.2 relaxed header: lower-case name, unfolded value, WSP runs to one SP,
    no WSP around the colon or at the end."""
    value = _WSP_RUN.sub(b" ", value.replace(b"\r\n", b"")).strip(b" ")
    return name.strip(b" \t").lower() + b":" + value + b"\r\n"


def header_fields(head: bytes) -> list[tuple[bytes, bytes]]:
    """The header block's fields as (lower-case name, value) in order; ``head`` ends with
    CRLF. A folded continuation line belongs to the field above it."""
    fields = []
    for raw in _FIELD_START.split(head):
        if not raw:
            continue
        name, _, value = raw.partition(b":")
        fields.append((name.strip(b" \t").lower(), value.removesuffix(b"\r\n")))
    return fields


def _fold_tags(tags: list[bytes]) -> bytes:
    """``DKIM-Signature:`` and its tags folded under 78 columns (breaks only where FWS is
    allowed: between tags, at the colons of h=, inside the base64 of b=); ``b=`` starts
    its own line so the signature has room."""
    lines: list[bytes] = []
    line = b"DKIM-Signature:"
    for tag in tags:
        pieces = [tag]
        if tag.startswith(b"h="):
            names = tag[2:].split(b":")
            pieces = [b"h=" + names[0]] + [b":" + n for n in names[1:]]
        for index, piece in enumerate(pieces):
            gap = b" " if index == 0 else b""
            too_long = len(line) + len(gap) + len(piece) > 76
            if (too_long or piece == b"b=") and line.strip():
                lines.append(line)
                line = b""
                gap = b" "
            line += gap + piece
    lines.append(line)
    return b"\r\n".join(lines)


def _b64_folded(signature: bytes, first_room: int) -> bytes:
    text = base64.b64encode(signature)
    parts = [text[:first_room]]
    parts.extend(text[i:i + 72] for i in range(first_room, len(text), 72))
    return b"\r\n ".join(part for part in parts if part)


def normalize_line_ends(message: bytes) -> bytes:
    """CRLF everywhere (what the SMTP transport sends, and what the body hash covers)."""
    if message.count(b"\n") == message.count(b"\r\n") == message.count(b"\r"):
        return message
    return _LINE_END.sub(b"\r\n", message)


def signature_header(key: SigningKey, fields: Sequence[tuple[bytes, bytes]], body_hash: bytes,
                     now: int) -> bytes:
    """One ``DKIM-Signature`` field (ending with CRLF) over ``fields`` and the body hash."""
    present: dict[bytes, int] = {}
    for name, _value in fields:
        present[name] = present.get(name, 0) + 1
    names: list[bytes] = []
    for name in SIGNED_HEADERS:
        count = present.get(name, 0) + (1 if name in OVERSIGNED and name in present else 0)
        names.extend([name] * count)
    if b"from" not in present:
        raise DkimError("a message without a From header cannot be DKIM-signed")
    tags = [b"v=1;", b"a=" + _SIG_ALGORITHM[key.algorithm] + b";", b"c=relaxed/relaxed;",
            b"d=" + key.domain.encode("ascii") + b";", b"s=" + key.selector.encode("ascii") + b";",
            b"t=" + str(now).encode("ascii") + b";", b"h=" + b":".join(names) + b";",
            b"bh=" + body_hash + b";", b"b="]
    unsigned = _fold_tags(tags)
    # RFC 6376 5.4.2: each listed name takes the last not-yet-used instance, bottom up.
    by_name: dict[bytes, list[bytes]] = {}
    for name, value in fields:
        by_name.setdefault(name, []).append(value)
    hashed = bytearray()
    for name in names:
        instances = by_name.get(name)
        if instances:
            hashed += canonical_header(name, instances.pop())
    hashed += canonical_header(b"dkim-signature", unsigned.partition(b":")[2])[:-2]
    signature = key.sign_digest_input(bytes(hashed))
    last_line = unsigned.rsplit(b"\r\n", 1)[-1]
    return unsigned + _b64_folded(signature, 76 - len(last_line)) + b"\r\n"


def sign_message(message: bytes, keys: Iterable[SigningKey], now: int | None = None) -> bytes:
    """``message`` with one DKIM-Signature per key prepended (line ends made CRLF).

    Guarantees: relaxed/relaxed canonicalisation, SHA-256 body hash over the whole body (no
    ``l=``), the headers of SIGNED_HEADERS that occur signed (From, Subject, To, Date,
    Message-ID, List-Unsubscribe and List-Unsubscribe-Post oversigned), every line under
    78 columns. Raises DkimError for a message without a From header.
    """
    message = normalize_line_ends(message)
    head, sep, body = message.partition(b"\r\n\r\n")
    if not sep:
        head, body = message.removesuffix(b"\r\n"), b""
    fields = header_fields(head + b"\r\n")
    body_hash = base64.b64encode(hashlib.sha256(canonical_body(body)).digest())
    stamp = int(time.time()) if now is None else now
    signatures = b"".join(signature_header(key, fields, body_hash, stamp) for key in keys)
    return signatures + message


# -- storage -----------------------------------------------------------------


@dataclass(frozen=True)
class KeyRecord:
    """A stored key as the pages and the CLI show it (never the private key)."""

    id: int
    domain: str
    selector: str
    algorithm: str
    status: str
    public_key: str
    created_at: Any
    activated_at: Any

    @property
    def record_name(self) -> str:
        return f"{self.selector}._domainkey.{self.domain}"

    @property
    def record_value(self) -> str:
        return dns_value(self.algorithm, self.public_key)

    @property
    def zone_line(self) -> str:
        return zone_line(self.domain, self.selector, self.record_value)


_KEY_COLUMNS = ("id, domain, selector, algorithm, status, public_key, created_at, "
                "activated_at")


def list_keys(conn: Connection, domain: str | None = None) -> list[KeyRecord]:
    """Keys of ``domain`` (or all), active first, then next, then retired."""
    rows = conn.execute(sa.text(
        f"SELECT {_KEY_COLUMNS} FROM dkim_keys "
        "WHERE (CAST(:domain AS text) IS NULL OR domain = :domain) "
        "ORDER BY domain, CASE status WHEN 'active' THEN 0 WHEN 'next' THEN 1 ELSE 2 END, "
        "algorithm, created_at DESC"), {"domain": domain}).all()
    return [KeyRecord(**row._mapping) for row in rows]


def _free_selector(conn: Connection, domain: str, algorithm: str) -> str:
    """The rotation selector not held by this domain's active key of ``algorithm``."""
    used = {row.selector for row in conn.execute(sa.text(
        "SELECT selector FROM dkim_keys WHERE domain = :d AND status <> 'retired'"),
        {"d": domain})}
    prefix = "" if algorithm == "rsa" else "ed-"
    for selector in (prefix + s for s in SELECTORS):
        if selector not in used:
            return selector
    raise DkimError(N_("%(domain)s already has an active and a next %(algorithm)s key: "
                       "activate or delete the next one first", domain=domain,
                       algorithm=algorithm))


def create_key(conn: Connection, secret_key: str, domain: str, *, selector: str | None = None,
               algorithm: str = "rsa") -> KeyRecord:
    """Generate and store a key for ``domain``.

    Guarantees: the private key is stored only encrypted; the key is ``active`` when the
    domain has no active key of that algorithm (mail is signed with it at once), otherwise
    ``next`` (publish its record, then activate it). A retired key holding the chosen
    selector is replaced. Raises DkimError for a bad domain, selector or algorithm, or a
    selector in use by an active or next key.
    """
    if algorithm not in ALGORITHMS:
        raise DkimError(_unknown_algorithm(algorithm))
    domain = normalize_domain(domain)
    conn.execute(sa.text("INSERT INTO sending_domains (domain) VALUES (:d) "
                         "ON CONFLICT (domain) DO NOTHING"), {"d": domain})
    # One writer per domain at a time, so two creates cannot both become active.
    conn.execute(sa.text("SELECT 1 FROM sending_domains WHERE domain = :d FOR UPDATE"),
                 {"d": domain})
    selector = check_selector(selector) if selector else _free_selector(conn, domain, algorithm)
    clash = conn.execute(sa.text(
        "SELECT status FROM dkim_keys WHERE domain = :d AND selector = :s"),
        {"d": domain, "s": selector}).scalar()
    if clash in ("active", "next"):
        raise DkimError(N_("selector %(selector)s of %(domain)s is in use by the %(clash)s key",
                           selector=selector, domain=domain, clash=word(clash)))
    conn.execute(sa.text("DELETE FROM dkim_keys WHERE domain = :d AND selector = :s"),
                 {"d": domain, "s": selector})
    has_active = conn.execute(sa.text(
        "SELECT 1 FROM dkim_keys WHERE domain = :d AND algorithm = :a AND status = 'active'"),
        {"d": domain, "a": algorithm}).first() is not None
    if has_active and conn.execute(sa.text(
            "SELECT 1 FROM dkim_keys WHERE domain = :d AND algorithm = :a AND status = 'next'"),
            {"d": domain, "a": algorithm}).first():
        raise DkimError(N_("%(domain)s already has a next %(algorithm)s key: activate or "
                           "delete it first", domain=domain, algorithm=algorithm))
    key = generate_private_key(algorithm)
    row = conn.execute(sa.text(
        "INSERT INTO dkim_keys (domain, selector, algorithm, status, public_key, "
        "private_key_encrypted, activated_at) VALUES (:d, :s, :a, :status, :pub, :priv, "
        "CASE WHEN :status = 'active' THEN now() END) RETURNING " + _KEY_COLUMNS),
        {"d": domain, "s": selector, "a": algorithm,
         "status": "next" if has_active else "active", "pub": public_key_b64(key),
         "priv": encrypt_private_key(secret_key, domain, selector, private_bytes(key))}).one()
    return KeyRecord(**row._mapping)


def activate_key(conn: Connection, domain: str, selector: str) -> KeyRecord:
    """Make ``selector`` the key that signs ``domain``'s mail (for its algorithm); the key
    it replaces becomes ``retired`` (keep its record published until mail in flight has
    arrived). Raises DkimError if there is no such key or it is retired."""
    domain = normalize_domain(domain)
    target = conn.execute(sa.text(
        "SELECT algorithm, status FROM dkim_keys WHERE domain = :d AND selector = :s "
        "FOR UPDATE"), {"d": domain, "s": selector}).first()
    if target is None:
        raise DkimError(N_("%(domain)s has no DKIM key with selector %(selector)s",
                           domain=domain, selector=selector))
    if target.status == "retired":
        raise DkimError(N_("the key %(selector)s of %(domain)s is retired: create a new one",
                           selector=selector, domain=domain))
    conn.execute(sa.text(
        "UPDATE dkim_keys SET status = 'retired' WHERE domain = :d AND algorithm = :a "
        "AND status = 'active' AND selector <> :s"),
        {"d": domain, "a": target.algorithm, "s": selector})
    row = conn.execute(sa.text(
        "UPDATE dkim_keys SET status = 'active', activated_at = COALESCE(activated_at, now()) "
        "WHERE domain = :d AND selector = :s RETURNING " + _KEY_COLUMNS),
        {"d": domain, "s": selector}).one()
    return KeyRecord(**row._mapping)


def delete_key(conn: Connection, domain: str, selector: str) -> bool:
    """Delete a next or retired key; an active key is never deleted (mail would go out
    unsigned): activate its successor first. Raises DkimError for an active key."""
    status = conn.execute(sa.text(
        "SELECT status FROM dkim_keys WHERE domain = :d AND selector = :s"),
        {"d": domain, "s": selector}).scalar()
    if status is None:
        return False
    if status == "active":
        raise DkimError(N_("the key %(selector)s of %(domain)s signs its mail: activate "
                           "another key first", selector=selector, domain=domain))
    conn.execute(sa.text("DELETE FROM dkim_keys WHERE domain = :d AND selector = :s"),
                 {"d": domain, "s": selector})
    return True


def load_signing_keys(conn: Connection, secret_key: str,
                      errors: list[str] | None = None) -> dict[str, list[SigningKey]]:
    """Every active key, decrypted, by domain. A key the secret key does not open is left
    out and its reason appended to ``errors`` (raised as KeyDecryptError when ``errors`` is
    None): ``senddock check`` and the Sending domains page name it."""
    keys: dict[str, list[SigningKey]] = {}
    for row in conn.execute(sa.text(
            "SELECT domain, selector, algorithm, private_key_encrypted FROM dkim_keys "
            "WHERE status = 'active' ORDER BY domain, algorithm DESC")):
        try:
            der = decrypt_private_key(secret_key, row.domain, row.selector,
                                      row.private_key_encrypted)
        except KeyDecryptError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            continue
        keys.setdefault(row.domain, []).append(
            SigningKey(row.domain, row.selector, row.algorithm, load_private_key(der)))
    return keys


def signing_domain(from_domain: str, domains: Iterable[str]) -> str | None:
    """The domain whose key signs mail From ``from_domain``: the domain itself, else its
    closest parent with a key (``d=example.com`` aligns with ``news.example.com`` under
    DMARC's relaxed alignment)."""
    available = set(domains)
    labels = from_domain.lower().rstrip(".").split(".")
    for index in range(len(labels) - 1):
        candidate = ".".join(labels[index:])
        if candidate in available:
            return candidate
    return None


def from_domain(message: bytes) -> str | None:
    """The domain of the message's (first) From address, lower-case; None without one."""
    head = message.partition(b"\r\n\r\n")[0] + b"\r\n"
    for name, value in header_fields(head):
        if name == b"from":
            return _address_domain(value)
    return None


@functools.lru_cache(maxsize=256)
def _address_domain(value: bytes) -> str | None:
    """A From field's domain (cached: a campaign's messages share one From)."""
    address = parseaddr(value.replace(b"\r\n", b"").decode("utf-8", "replace"))[1]
    return domain_of(address) or None


class KeyRing:
    """The active keys, reloaded at most every ``refresh`` seconds; shared by worker threads.

    A key created or activated on the Sending domains page signs mail within ``refresh``
    seconds, without a restart.
    """

    def __init__(self, engine: Engine, secret_key: str, refresh: float = 30.0) -> None:
        self.engine = engine
        self.secret_key = secret_key
        self.refresh = refresh
        self._keys: dict[str, list[SigningKey]] = {}
        self._loaded_at = float("-inf")
        self._lock = threading.Lock()

    def any(self) -> bool:
        """Whether any domain has an active key (no key: no message needs looking at)."""
        self._reload_when_due()
        return bool(self._keys)

    def keys_for(self, from_domain: str) -> list[SigningKey]:
        """The keys that sign mail From ``from_domain`` (empty: it goes out unsigned)."""
        self._reload_when_due()
        domain = signing_domain(from_domain, self._keys)
        return self._keys[domain] if domain else []

    def _reload_when_due(self) -> None:
        if time.monotonic() - self._loaded_at > self.refresh:
            with self._lock:
                if time.monotonic() - self._loaded_at > self.refresh:
                    errors: list[str] = []
                    with self.engine.connect() as conn:
                        self._keys = load_signing_keys(conn, self.secret_key, errors)
                    for error in errors:  # that domain's mail goes out unsigned, not lost
                        log.error("DKIM: %s", error)
                    self._loaded_at = time.monotonic()

    def sign(self, message: bytes, from_domain: str) -> bytes:
        """``message`` signed with ``from_domain``'s keys, unchanged when it has none."""
        keys = self.keys_for(from_domain)
        return sign_message(message, keys) if keys else message
