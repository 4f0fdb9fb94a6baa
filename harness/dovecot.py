"""A private Dovecot (Debian ``dovecot-imapd`` / ``dovecot-pop3d``) for the tests.

``DovecotServer`` writes its own configuration under a temp dir and runs ``dovecot -c FILE``:
its own base_dir and state dir, users in a passwd-file, one maildir per user under the
temp dir, IMAPS and POP3S with a certificate from a throw-away CA, plain IMAP and POP3,
every listener on a free loopback port. ``stop()`` stops that instance only (its own
master process, run in the foreground as our child). The system's Dovecot is never touched.

The tests assert through Dovecot's own record: the maildir's files and their flags, and
what an IMAP login sees.
"""

from __future__ import annotations

import contextlib
import imaplib
import os
import pwd
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.postfix import make_certificates
from webapp.pgserver import free_port

DOVECOT = shutil.which("dovecot", path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", ""))
LDA = "/usr/lib/dovecot/dovecot-lda"
INSTALL_HINT = "apt-get install dovecot-imapd dovecot-pop3d"


def missing() -> str | None:
    """Why a private Dovecot cannot run here (None when it can)."""
    if DOVECOT is None:
        return INSTALL_HINT
    if not Path("/usr/lib/dovecot/imap").exists():
        return "apt-get install dovecot-imapd"
    if not Path("/usr/lib/dovecot/pop3").exists():
        return "apt-get install dovecot-pop3d"
    return None


@dataclass(frozen=True)
class ServerCert:
    ca_file: Path    # the CA to trust (SENDDOCK_BOUNCE_MAILBOX_CA_FILE)
    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class Ports:
    imap: int
    imaps: int
    pop3: int
    pop3s: int


_CONFIG = """\
# Private Dovecot for SendDock's tests; nothing here touches the system's instance.
instance_name = {instance}
base_dir = {root}/run
state_dir = {root}/state
protocols = imap pop3
listen = 127.0.0.1
log_path = {root}/dovecot.log
info_log_path = {root}/dovecot.log
auth_verbose = yes
default_internal_user = {internal_user}
default_internal_group = {internal_group}
default_login_user = {login_user}
first_valid_uid = {uid}
last_valid_uid = {uid}
first_valid_gid = {gid}
last_valid_gid = {gid}
ssl = yes
ssl_cert = <{cert}
ssl_key = <{key}
ssl_dh = </usr/share/dovecot/dh.pem
ssl_min_protocol = TLSv1.2
# Plain IMAP/POP3 on loopback are part of what SendDock supports (imap://).
disable_plaintext_auth = no
auth_mechanisms = plain login
mail_location = maildir:~/Maildir
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/passwd
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {root}/passwd
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {ports.imap}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {ports.imaps}
    ssl = yes
  }}
}}
service pop3-login {{
  inet_listener pop3 {{
    address = 127.0.0.1
    port = {ports.pop3}
  }}
  inet_listener pop3s {{
    address = 127.0.0.1
    port = {ports.pop3s}
    ssl = yes
  }}
}}
service auth {{
  unix_listener auth-userdb {{
    mode = 0666
  }}
}}
protocol lda {{
  postmaster_address = postmaster@localhost
}}
"""


class DovecotServer:
    """One private Dovecot instance. ``start()``, then ``add_user()``/``deliver()``, then
    ``stop()``. Mail is owned by one unprivileged uid (``nobody`` when run as root, the
    current user otherwise), the uid a private Postfix's virtual(8) delivery must use too."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="senddock-dovecot-"))
        # The mail uid must reach its maildir: pytest's tmp dirs are 0700 to root.
        self.root.chmod(0o755)
        self.config_file = self.root / "dovecot.conf"
        self.ports = Ports(free_port(), free_port(), free_port(), free_port())
        if os.geteuid() == 0:
            mail = pwd.getpwnam("nobody")
            self.uid, self.gid = mail.pw_uid, mail.pw_gid
            internal, login = "dovecot", "dovenull"
            internal_group = "dovecot"
        else:
            me = pwd.getpwuid(os.geteuid())
            self.uid, self.gid = me.pw_uid, me.pw_gid
            internal = login = me.pw_name
            internal_group = str(me.pw_gid)
        (self.root / "tls").mkdir()
        self.tls = ServerCert(*make_certificates(self.root / "tls", "localhost"))
        self.users: dict[str, str] = {}
        self._passwd = self.root / "passwd"
        self._passwd.write_text("")
        self.config_file.write_text(_CONFIG.format(
            instance=f"senddock-test-{secrets.token_hex(3)}", root=self.root, ports=self.ports,
            internal_user=internal, internal_group=internal_group, login_user=login,
            uid=self.uid, gid=self.gid, cert=self.tls.cert_file, key=self.tls.key_file))
        (self.root / "mail").mkdir(exist_ok=True)
        os.chown(self.root / "mail", self.uid, self.gid)
        self._proc: subprocess.Popen[bytes] | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self, timeout: float = 20) -> None:
        """Start the master process in the foreground (our child: we stop exactly it) and
        wait until every listener answers."""
        assert DOVECOT is not None, INSTALL_HINT
        out = open(self.root / "master.out", "ab")
        self._proc = subprocess.Popen([DOVECOT, "-F", "-c", str(self.config_file)],
                                      stdin=subprocess.DEVNULL, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + timeout
        for port in (self.ports.imap, self.ports.imaps, self.ports.pop3, self.ports.pop3s):
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(f"dovecot exited ({self._proc.returncode}): "
                                       f"{(self.root / 'master.out').read_text()}\n{self.log()}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"dovecot did not listen on {port}\n{self.log()}") from None
                    time.sleep(0.05)

    def stop(self, timeout: float = 10) -> None:
        """Stop this instance's master (it stops its own children); nothing else."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # The master's session is its own (start_new_session): end the whole group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        path = self.root / "dovecot.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- users and mail ----------------------------------------------------------------

    def add_user(self, user: str, password: str | None = None) -> str:
        """Create a login with an empty maildir; returns its password. Dovecot rereads the
        passwd-file when it changes, so users can be added while it runs."""
        password = password or secrets.token_urlsafe(12)
        home = self.home(user)
        for sub in ("cur", "new", "tmp"):
            (home / "Maildir" / sub).mkdir(parents=True, exist_ok=True)
        for path in (home, home / "Maildir", *(home / "Maildir").iterdir()):
            os.chown(path, self.uid, self.gid)
        self.users[user] = password
        lines = [f"{u}:{{PLAIN}}{p}:{self.uid}:{self.gid}::{self.home(u)}::"
                 for u, p in self.users.items()]
        tmp = self._passwd.with_suffix(".new")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self._passwd)
        # passwd-file's change check is by mtime (seconds): make sure it sees a new one.
        stamp = time.time() + len(self.users)
        os.utime(self._passwd, (stamp, stamp))
        return password

    def home(self, user: str) -> Path:
        return self.root / "mail" / user

    def maildir(self, user: str) -> Path:
        return self.home(user) / "Maildir"

    def deliver(self, user: str, raw: bytes, timeout: float = 20) -> None:
        """Deliver one message into ``user``'s INBOX with Dovecot's own LDA."""
        result = subprocess.run([LDA, "-c", str(self.config_file), "-d", user], input=raw,
                                capture_output=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"dovecot-lda failed ({result.returncode}): "
                               f"{result.stderr.decode(errors='replace')}\n{self.log()}")

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this instance's CA (and nothing else)."""
        return ssl.create_default_context(cafile=str(self.tls.ca_file))


@dataclass
class Mailbox:
    """One user's mailbox on a running :class:`DovecotServer` (the per-test fixture)."""

    server: DovecotServer
    user: str
    password: str

    def url(self, scheme: str = "imaps", folder: str = "INBOX") -> str:
        """A ``SENDDOCK_BOUNCE_MAILBOX`` value for this mailbox."""
        port = {"imaps": self.server.ports.imaps, "imap": self.server.ports.imap,
                "pop3s": self.server.ports.pop3s, "pop3": self.server.ports.pop3}[scheme]
        path = f"/{folder}" if scheme.startswith("imap") else ""
        return f"{scheme}://{self.user}:{self.password}@127.0.0.1:{port}{path}"

    def deliver(self, raw: bytes) -> None:
        """Deliver with Dovecot's LDA (as an MTA would)."""
        self.server.deliver(self.user, raw)

    def append(self, messages: list[bytes], folder: str = "INBOX") -> None:
        """Put many messages into ``folder`` over one IMAP connection (APPEND): quicker
        than the LDA when a test needs hundreds."""
        client = self.imap()
        try:
            for raw in messages:
                typ, data = client.append(folder, "", None, raw)
                assert typ == "OK", data
        finally:
            client.logout()

    def files(self) -> dict[str, list[Path]]:
        """The maildir's message files by sub-directory (``new``, ``cur``, and one entry
        per other folder, e.g. ``.Processed``): Dovecot's own record on disk."""
        root = self.server.maildir(self.user)
        found = {sub: sorted((root / sub).iterdir()) for sub in ("new", "cur")}
        for folder in sorted(root.glob(".*")):
            if folder.is_dir():
                found[folder.name] = sorted(p for sub in ("new", "cur")
                                            for p in (folder / sub).glob("*"))
        return found

    def imap(self) -> imaplib.IMAP4_SSL:
        """A logged-in IMAPS client (the caller logs out)."""
        client = imaplib.IMAP4_SSL("127.0.0.1", self.server.ports.imaps,
                                   ssl_context=self.server.ssl_context(), timeout=10)
        client.login(self.user, self.password)
        return client

    def flags(self, folder: str = "INBOX") -> list[set[str]]:
        """The IMAP flags of every message in ``folder``, in UID order, as IMAP sees them."""
        client = self.imap()
        try:
            typ, _ = client.select(folder, readonly=True)
            if typ != "OK":
                return []
            typ, data = client.uid("FETCH", "1:*", "(FLAGS)")
            result: list[set[str]] = []
            for item in data:
                if not item:
                    continue
                text = item.decode() if isinstance(item, bytes) else str(item)
                if "FLAGS (" not in text:
                    continue
                inner = text.split("FLAGS (", 1)[1].split(")", 1)[0]
                result.append(set(inner.split()))
            return result
        finally:
            client.logout()

    def count(self, folder: str = "INBOX") -> int:
        client = self.imap()
        try:
            typ, data = client.select(folder, readonly=True)
            return int(data[0]) if typ == "OK" and data and data[0] else 0
        finally:
            client.logout()
