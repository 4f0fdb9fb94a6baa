"""OpenDKIM as an independent receiver: ``opendkim -t`` (its test mode: the milter's own
verification code, reading one message from a file) with libunbound forwarding every DNS
query to the tests' local DNS server. What it verifies is what a Postfix + OpenDKIM MX
would verify."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

BINARY = "/usr/sbin/opendkim"
INSTALL_HINT = "apt-get install opendkim opendkim-tools"


def unavailable_reason() -> str | None:
    if not (Path(BINARY).exists() or shutil.which("opendkim")):
        return INSTALL_HINT
    return None


def verify(message: bytes, dns_port: int, workdir: Path) -> list[str]:
    """The ``dkim=`` results OpenDKIM puts in its Authentication-Results header, one per
    signature (``pass``, ``fail``, ``neutral``, ``permerror``...)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "unbound.conf").write_text(
        "server:\n  do-not-query-localhost: no\n  module-config: \"iterator\"\n"
        f"forward-zone:\n  name: \".\"\n  forward-addr: 127.0.0.1@{dns_port}\n")
    (workdir / "opendkim.conf").write_text(
        f"Mode v\nSyslog no\nResolverConfiguration {workdir / 'unbound.conf'}\n"
        "AlwaysAddARHeader yes\nAuthservID senddock-test\n")
    (workdir / "message.eml").write_bytes(message)
    result = subprocess.run([shutil.which("opendkim") or BINARY, "-x",
                             str(workdir / "opendkim.conf"), "-f", "-t",
                             str(workdir / "message.eml"), "-vv"],
                            capture_output=True, text=True, timeout=60)
    results = re.findall(r"\bdkim=(\w+)", result.stdout)
    if not results:
        raise AssertionError(f"opendkim gave no result: {result.stdout}{result.stderr}")
    return results
