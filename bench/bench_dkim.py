"""DKIM signing cost per message: dkimpy (pure-Python RSA, PyNaCl ed25519) against
SendDock's signer (``workers.building.dkim``, OpenSSL through ``cryptography``), RSA-2048 and
ed25519, on a typical campaign message (multipart, ~3 KB, List-Unsubscribe headers).

    python -m bench.bench_dkim --messages 2000

CPU milliseconds per message are ``time.process_time()`` over the run (one thread);
every signature of the last message is checked with dkimpy's verifier.
"""

from __future__ import annotations

import argparse
import base64
import os
import platform
import time
from collections.abc import Callable

import dkim
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from bench.common import _cpu_model, save, table
from workers.building import dkim as senddock_dkim
from workers.building.message import build_mime

TEXT = ("Hello {name},\n\n" + "This month's news, with a paragraph of ordinary length. " * 30
        + "\n\nUnsubscribe: https://mail.example.com/u/{token}\n")
HTML = ("<html><body><p>Hello {name},</p>" + "<p>This month's news, with a paragraph.</p>" * 30
        + '<p><a href="https://mail.example.com/u/{token}">Unsubscribe</a></p></body></html>')


def message(i: int) -> bytes:
    token = f"{i:08d}abcdefabcdefabcdef"
    return build_mime(
        from_addr="Example News <news@example.com>", to_addr=f"user{i}@example.org",
        subject="Our December newsletter: what changed", text=TEXT.format(name=i, token=token),
        html=HTML.format(name=i, token=token), message_id=f"<{i}.c0ffee@example.com>",
        headers={"List-Unsubscribe": f"<https://mail.example.com/u/{token}>",
                 "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
                 "List-Id": "<news.example.com>", "X-SendDock-Correlation-ID": token})


def cpu_ms(sign: Callable[[bytes], bytes], count: int) -> tuple[float, bytes]:
    messages = [message(i) for i in range(count)]
    started = time.process_time()
    signed = b""
    for raw in messages:
        signed = sign(raw)
    return (time.process_time() - started) * 1000 / count, signed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--dkimpy-messages", type=int, default=200,
                        help="dkimpy's RSA is slow; fewer messages for it")
    args = parser.parse_args()
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ed_key = ed25519.Ed25519PrivateKey.generate()
    rsa_pem = rsa_key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.TraditionalOpenSSL,
                                    serialization.NoEncryption())
    ed_seed = ed_key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                   serialization.NoEncryption())
    ed_b64 = base64.b64encode(ed_seed)
    records = {
        b"rsa._domainkey.example.com.": senddock_dkim.dns_value(
            "rsa", senddock_dkim.public_key_b64(rsa_key)).encode(),
        b"ed._domainkey.example.com.": senddock_dkim.dns_value(
            "ed25519", senddock_dkim.public_key_b64(ed_key)).encode(),
    }
    headers = [h.encode() for h in ("From", "To", "Subject", "Date", "Message-ID",
                                    "MIME-Version", "Content-Type", "List-Unsubscribe",
                                    "List-Unsubscribe-Post", "List-Id")]
    ours_rsa = senddock_dkim.SigningKey("example.com", "rsa", "rsa", rsa_key)
    ours_ed = senddock_dkim.SigningKey("example.com", "ed", "ed25519", ed_key)
    cases: list[tuple[str, Callable[[bytes], bytes], int]] = [
        ("dkimpy RSA-2048", lambda m: dkim.sign(
            m, b"rsa", b"example.com", rsa_pem, include_headers=headers,
            canonicalize=(b"relaxed", b"relaxed")) + m, args.dkimpy_messages),
        ("dkimpy ed25519", lambda m: dkim.sign(
            m, b"ed", b"example.com", ed_b64, signature_algorithm=b"ed25519-sha256",
            include_headers=headers, canonicalize=(b"relaxed", b"relaxed")) + m,
         args.messages),
        ("SendDock RSA-2048 (cryptography)",
         lambda m: senddock_dkim.sign_message(m, [ours_rsa]), args.messages),
        ("SendDock ed25519 (cryptography)",
         lambda m: senddock_dkim.sign_message(m, [ours_ed]), args.messages),
        ("SendDock RSA-2048 + ed25519",
         lambda m: senddock_dkim.sign_message(m, [ours_rsa, ours_ed]), args.messages),
    ]
    started = time.process_time()
    for i in range(args.messages):
        message(i)
    build_ms = (time.process_time() - started) * 1000 / args.messages
    rows = [["(building the message, for scale)", f"{args.messages:,}", f"{build_ms:.3f}", "-",
             "-"]]
    results: dict[str, object] = {"build_ms_per_msg": build_ms}
    for name, sign, count in cases:
        total, signed = cpu_ms(sign, count)
        verified = dkim.verify(
            signed, dnsfunc=lambda n, timeout=5: records[n if n.endswith(b".") else n + b"."])
        results[name] = {"messages": count, "signing_ms_per_msg": total, "verified": verified}
        rows.append([name, f"{count:,}", f"{total:.3f}", f"{1000 / total:,.0f}",
                     "yes" if verified else "NO"])
    info = (f"{os.cpu_count()} cores, {_cpu_model()}, Python {platform.python_version()}, "
            f"load {os.getloadavg()[0]:.2f}")
    print(table(f"DKIM signing, CPU per message, one thread ({info})",
                ["signer", "messages", "CPU ms/msg", "messages/s per core", "verifies"], rows))
    print(f"\nsaved {save('dkim', {'args': vars(args), 'machine': info, 'results': results})}")


if __name__ == "__main__":
    main()
