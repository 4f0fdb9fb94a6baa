"""A private Postfix relay for the tests: Debian's ``postfix`` 3.7 and Cyrus SASL
(``sasl2-bin``), started with its own configuration, queue and data directories, listening
only on a free loopback port. No system-wide instance is read, written or started.

What one :class:`Postfix` gives a test
--------------------------------------

- **smtpd** on ``127.0.0.1:<port>`` (``inet_interfaces = 127.0.0.1``), started with
  ``postfix -c <config dir> start`` and stopped with ``postfix -c <config dir> stop``.
  ``myhostname`` is ``relay-<id>.senddock.test``, so the banner names this instance.
- **STARTTLS** (``smtpd_tls_security_level = may``) with a certificate for
  ``localhost``/``127.0.0.1``/``myhostname`` signed by a private CA the fixture makes
  (``ca_file``: the CA's PEM, for ``SENDDOCK_SMTP_CA_FILE`` and ``ssl`` contexts).
- **SASL AUTH** (Cyrus, ``auxprop``/``sasldb``, mechanisms ``CRAM-MD5 PLAIN LOGIN``) from
  a private sasldb made with ``saslpasswd2 -f``: :meth:`Postfix.add_user` /
  :meth:`remove_user`. One user exists after every reset: :data:`USER` / :data:`PASSWORD`.
- **Maps the test writes** (``texthash``, so no postmap): :meth:`write_map` with one of
  ``client_access``, ``helo_access``, ``sender_access``, ``recipient_access`` (wired
  into the matching ``smtpd_*_restrictions``), ``sender_login`` (for
  ``reject_sender_login_mismatch``), ``transport`` (``transport_maps``), or any other name
  your own settings refer to via :meth:`map_ref`. Values are access(5) actions:
  ``"554 5.7.1 go away"``, ``"450 4.7.1 later"``, ``"OK"``, ``"REJECT"``...
- **Any main.cf setting**: :meth:`configure` (e.g. ``smtpd_delay_reject="no"``,
  ``smtpd_client_recipient_rate_limit="10"``, ``smtpd_tls_security_level="encrypt"``,
  ``mydestination=..., local_recipient_maps=""`` for a bounce loop) and **master.cf
  services**: :meth:`add_service` (e.g. an ``lmtp`` variant). Both reload Postfix and wait
  until the master says it re-read its configuration. Anvil limits apply to loopback
  clients too (``smtpd_client_event_limit_exceptions`` is empty).
- **Delivered mail with its envelope**: every domain goes to the ``mailbox`` transport
  (pipe(8) running a tiny shell script as ``nobody``), one file per recipient holding the
  envelope sender, the recipient, the queue id and the message bytes exactly as Postfix
  delivers them (its ``Received:`` added, nothing else: ``local_header_rewrite_clients``
  is empty). :meth:`messages` returns :class:`Delivered` records; :meth:`wait_for_messages`
  waits. A null sender is ``""``. Route a domain elsewhere with
  ``write_map("transport", {"bounces.test": "lmtp:inet:127.0.0.1:2424"})``.
- **Its own log** (``maillog_file`` written by postlogd): :meth:`log` (lines since the last
  reset or :meth:`mark`), :meth:`log_entries` (parsed: timestamp, program, text),
  :meth:`accepted_times` (one timestamp per accepted message, from cleanup's
  ``message-id=`` line: what the relay's own clock says about a send rate; whole seconds,
  postlogd's resolution), :meth:`count` (lines matching a regex).
- :meth:`reset` (what the per-test ``relay`` fixture calls): the base configuration again,
  empty maps, only the default SASL user, an empty mailbox and queue, a new log mark;
  reloads only when something had changed. :meth:`stop` / :meth:`start` in a test (a relay
  that goes away mid-drain); the fixture starts it again for the next test.
- :meth:`smtp_url` builds a ``SENDDOCK_SMTP_URL`` for it.

Why the files are not under pytest's ``tmp_path``: Postfix's daemons run as ``postfix``
and the mailbox script as ``nobody``, and pytest keeps its base temp dir ``0700``
(re-tightened at every session start), so the instance lives in its own
``tempfile.mkdtemp()`` directory (``0755``) that :meth:`close` removes.

A test process killed with SIGKILL cannot run the teardown: its instance keeps running;
``owner.pid`` in the instance directory names the process that started it, so a stale one
can be stopped with ``postfix -c <dir>/conf stop`` (and the directory removed).

Needs root (the master starts as root and drops privileges) and the Debian packages;
:func:`unavailable_reason` says what is missing so the fixture can skip with it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email
import email.message
import email.policy
import ipaddress
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from webapp.pgserver import free_port

INSTALL_HINT = "apt-get install postfix sasl2-bin"
DAEMON_DIR = Path("/usr/lib/postfix/sbin")
USER = "sender@relay.test"
PASSWORD = "correct-relay-password"
MAPS = ("client_access", "helo_access", "sender_access", "recipient_access", "sender_login",
        "transport")
MECHANISMS = "CRAM-MD5 PLAIN LOGIN"

_DELIVER_SH = """\
# pipe(8) delivery: $1 mailbox dir, $2 queue id, $3 sender, $4 recipient; message on stdin.
# Written to tmp/ then renamed into new/, so a reader never sees half a message.
name="$2.$$.$(date +%s%N)"
{ printf '%s\\n%s\\n%s\\n' "$3" "$4" "$2"; cat; } > "$1/tmp/$name" || exit 75
mv "$1/tmp/$name" "$1/new/$name" || exit 75
"""

_MASTER_CF = """\
# service type  private unpriv  chroot  wakeup  maxproc command + args
{port} inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
tlsmgr    unix  -       -       n       1000?   1       tlsmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
local     unix  -       n       n       -       -       local
virtual   unix  -       n       n       -       -       virtual
lmtp      unix  -       -       n       -       -       lmtp
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
mailbox   unix  -       n       n       -       -       pipe
  flags=q null_sender= user=nobody
  argv=/bin/sh {root}/deliver.sh {root}/mailbox ${{queue_id}} ${{sender}} ${{recipient}}
"""


def unavailable_reason() -> str | None:
    """Why a private Postfix cannot run here (None when it can)."""
    missing = [name for name in ("postfix", "postconf", "postsuper", "saslpasswd2")
               if shutil.which(name) is None]
    if missing or not (DAEMON_DIR / "smtpd").exists():
        return f"{INSTALL_HINT} (missing: {', '.join(missing) or 'smtpd'})"
    if not Path("/usr/lib/x86_64-linux-gnu/sasl2/libsasldb.so.2").exists() and not list(
            Path("/usr/lib").glob("*/sasl2/libsasldb.so*")):
        return f"{INSTALL_HINT} libsasl2-modules (the sasldb plugin is missing)"
    if os.geteuid() != 0:
        return "a private Postfix must be started as root (its master drops privileges)"
    for user in ("postfix", "nobody"):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"{INSTALL_HINT} (no '{user}' user)"
    return None


# --- certificates ------------------------------------------------------------------------


def make_certificates(directory: Path, hostname: str) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate it signs (for ``localhost``, ``127.0.0.1``
    and ``hostname``). Returns (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "SendDock test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(days=1))
          .not_valid_after(now + dt.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.DNSName(hostname),
             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, cert_path, key_path = (directory / "ca.pem", directory / "server.pem",
                                    directory / "server.key")
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return ca_path, cert_path, key_path


# --- what the relay recorded -------------------------------------------------------------


@dataclass(frozen=True)
class Delivered:
    """One message as the relay delivered it to one recipient."""

    sender: str  # envelope sender ("" for the null sender)
    recipient: str  # envelope recipient
    queue_id: str
    data: bytes  # the message bytes (LF line ends, Postfix's Received: on top)
    path: Path

    @property
    def message(self) -> email.message.EmailMessage:
        parsed = email.message_from_bytes(self.data, policy=email.policy.default)
        assert isinstance(parsed, email.message.EmailMessage)
        return parsed


@dataclass(frozen=True)
class LogEntry:
    at: dt.datetime  # postlogd's timestamp (whole seconds, the host's local time zone)
    program: str  # "postfix/smtpd", "postfix/cleanup", ...
    text: str
    line: str


_LOG_LINE = re.compile(r"^(\w{3} [ \d]\d \d\d:\d\d:\d\d) \S+ (\S+?)\[\d+\]: (.*)$")


def parse_log_line(line: str, year: int | None = None) -> LogEntry | None:
    match = _LOG_LINE.match(line)
    if match is None:
        return None
    year = year or dt.datetime.now().year
    at = dt.datetime.strptime(f"{year} {match[1]}", "%Y %b %d %H:%M:%S")
    return LogEntry(at=at, program=match[2], text=match[3], line=line)


# --- the instance ------------------------------------------------------------------------


class PostfixError(RuntimeError):
    pass


class Postfix:
    """One private Postfix instance (see the module docstring for what it offers).

    ``main_cf`` adds to or overrides the base main.cf for the instance's whole life (every
    :meth:`reset` goes back to base + these); ``services`` adds master.cf entries
    (``{"name": "unix - - n - - lmtp"}``) likewise.
    """

    def __init__(self, *, main_cf: dict[str, str] | None = None,
                 services: dict[str, str] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="senddock-postfix-"))
        self.root.chmod(0o755)
        self.config_dir = self.root / "conf"
        self.maps_dir = self.root / "maps"
        self.mailbox_dir = self.root / "mailbox"
        self.log_path = self.root / "maillog"
        self.sasldb = self.root / "sasldb2"
        self.host = "127.0.0.1"
        self.port = 0
        self.hostname = f"relay-{self.root.name.rsplit('-', 1)[-1].lower()}.senddock.test"
        self._extra_main = dict(main_cf or {})
        self._extra_services = dict(services or {})
        self._overrides: dict[str, str] = {}
        self._added_services: dict[str, str] = {}
        self._dirty = False
        self._mark = 0
        self.running = False
        for d in (self.config_dir, self.config_dir / "sasl", self.maps_dir,
                  self.root / "queue", self.root / "data",
                  self.mailbox_dir / "new", self.mailbox_dir / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.mailbox_dir, self.mailbox_dir / "new", self.mailbox_dir / "tmp"):
            shutil.chown(d, "nobody")
        shutil.chown(self.root / "data", "postfix")
        (self.root / "deliver.sh").write_text(_DELIVER_SH)
        # Who started it: a pytest killed with SIGKILL cannot stop its instance, and this
        # says whose it was (stop it with `postfix -c <dir>/conf stop` once that is dead).
        (self.root / "owner.pid").write_text(f"{os.getpid()}\n")
        self.ca_file, self.cert_file, self.key_file = make_certificates(self.root,
                                                                        self.hostname)
        (self.config_dir / "sasl" / "smtpd.conf").write_text(
            f"pwcheck_method: auxprop\nauxprop_plugin: sasldb\nmech_list: {MECHANISMS}\n"
            f"sasldb_path: {self.sasldb}\n")
        self._reset_maps()
        self._reset_users()

    # --- configuration -----------------------------------------------------------------

    def map_ref(self, name: str) -> str:
        """``texthash:<path>`` of a map this instance owns (made empty if new)."""
        path = self.maps_dir / name
        if not path.exists():
            path.write_text("")
        return f"texthash:{path}"

    def base_settings(self) -> dict[str, str]:
        """The main.cf every reset returns to (before ``main_cf`` and :meth:`configure`)."""
        return {
            "compatibility_level": "3.6",
            "queue_directory": str(self.root / "queue"),
            "data_directory": str(self.root / "data"),
            "maillog_file": str(self.log_path),
            "maillog_file_prefixes": str(self.root),
            "myhostname": self.hostname,
            "mydomain": "senddock.test",
            "myorigin": "$myhostname",
            "mydestination": "",
            "inet_interfaces": "127.0.0.1",
            "inet_protocols": "ipv4",
            "mynetworks": "127.0.0.0/8",
            "smtpd_peername_lookup": "no",
            # Long queue IDs carry the time the message was queued to the microsecond:
            # Postfix's own precise record (its log lines have whole seconds, stamped late).
            "enable_long_queue_ids": "yes",
            "smtpd_banner": "$myhostname ESMTP",
            "local_header_rewrite_clients": "",
            "default_transport": "mailbox",
            "relay_transport": "mailbox",
            "mailbox_destination_recipient_limit": "1",
            "transport_maps": self.map_ref("transport"),
            "alias_maps": "",
            "alias_database": "",
            "fast_flush_domains": "",
            "smtp_dns_support_level": "disabled",
            "smtpd_client_restrictions": f"check_client_access {self.map_ref('client_access')}",
            "smtpd_helo_restrictions": f"check_helo_access {self.map_ref('helo_access')}",
            "smtpd_sender_restrictions": f"check_sender_access {self.map_ref('sender_access')}",
            "smtpd_relay_restrictions":
                "permit_mynetworks, permit_sasl_authenticated, reject_unauth_destination",
            "smtpd_recipient_restrictions":
                f"check_recipient_access {self.map_ref('recipient_access')}",
            "smtpd_sender_login_maps": self.map_ref("sender_login"),
            "smtpd_client_event_limit_exceptions": "",
            "smtpd_tls_security_level": "may",
            "smtpd_tls_cert_file": str(self.cert_file),
            "smtpd_tls_key_file": str(self.key_file),
            "smtpd_tls_loglevel": "1",
            "smtpd_sasl_auth_enable": "yes",
            "smtpd_sasl_type": "cyrus",
            "smtpd_sasl_path": "smtpd",
            "cyrus_sasl_config_path": str(self.config_dir / "sasl"),
            "smtpd_sasl_security_options": "noanonymous",
            "smtpd_sasl_local_domain": "",
            "broken_sasl_auth_clients": "no",
            # A failed AUTH is answered at once (the default waits 1 s per error).
            "smtpd_error_sleep_time": "0",
            "maximal_queue_lifetime": "1h",
            "minimal_backoff_time": "10s",
            "maximal_backoff_time": "30s",
            "queue_run_delay": "10s",
        }

    def _write_config(self) -> None:
        settings = {**self.base_settings(), **self._extra_main, **self._overrides}
        main_cf = self.config_dir / "main.cf"
        main_cf.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
        services = {**self._extra_services, **self._added_services}
        master = _MASTER_CF.format(port=f"{self.host}:{self.port}", root=self.root)
        master += "".join(f"{name} {line}\n" for name, line in services.items())
        (self.config_dir / "master.cf").write_text(master)
        # Postfix waits (up to ~2 s, in 0.3 s steps) for a main.cf modified "just now" to
        # settle; ours is complete when written, so date it back.
        past = time.time() - 10
        for path in (main_cf, self.config_dir / "master.cf"):
            os.utime(path, (past, past))

    def configure(self, **settings: str) -> None:
        """Set main.cf parameters (until the next reset) and reload."""
        self._overrides.update(settings)
        self._dirty = True
        self._write_config()
        self.reload()

    def add_service(self, name: str, line: str) -> None:
        """Add a master.cf service (``line`` is everything after the name) and reload."""
        self._added_services[name] = line
        self._dirty = True
        self._write_config()
        self.reload()

    def write_map(self, name: str, entries: dict[str, str], *, reload: bool = True) -> None:
        """Replace a texthash map's content (``{key: value}``) and reload."""
        lines = "".join(f"{key} {value}\n" for key, value in entries.items())
        (self.maps_dir / name).write_text(lines)
        self._dirty = True
        if reload:
            self.reload()

    def _reset_maps(self) -> None:
        for name in MAPS:
            (self.maps_dir / name).write_text("")
        for extra in self.maps_dir.iterdir():
            if extra.name not in MAPS:
                extra.unlink()

    # --- SASL users ----------------------------------------------------------------------

    def add_user(self, login: str, password: str) -> None:
        """Create (or change) a SASL user ``name@realm`` in the private sasldb."""
        name, _, realm = login.partition("@")
        args = ["saslpasswd2", "-f", str(self.sasldb), "-p", "-c"]
        if realm:
            args += ["-u", realm]
        subprocess.run([*args, name], input=password.encode(), check=True, timeout=30,
                       capture_output=True)
        shutil.chown(self.sasldb, "postfix")
        self.sasldb.chmod(0o600)

    def remove_user(self, login: str) -> None:
        name, _, realm = login.partition("@")
        args = ["saslpasswd2", "-f", str(self.sasldb), "-d"]
        if realm:
            args += ["-u", realm]
        subprocess.run([*args, name], check=True, timeout=30, capture_output=True)

    def _reset_users(self) -> None:
        self.sasldb.unlink(missing_ok=True)
        self.add_user(USER, PASSWORD)

    # --- lifecycle -------------------------------------------------------------------------

    def _postfix(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["postfix", "-c", str(self.config_dir), *args],
                                capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise PostfixError(f"postfix {' '.join(args)} failed: "
                               f"{result.stdout}{result.stderr}{self._log_tail()}")
        return result

    def _log_tail(self, n: int = 15) -> str:
        if not self.log_path.exists():
            return ""
        return "\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def start(self, timeout: float = 30) -> None:
        """Start the instance (on a fresh free port the first time) and wait for its banner."""
        if self.running:
            return
        for _attempt in range(3):
            if not self.port:
                self.port = free_port()
            self._write_config()
            mark = self._size()
            self._postfix("start")
            if self._wait_ready(mark, timeout):
                self.running = True
                return
            self._postfix("stop", check=False)
            self.port = 0  # lost the race for the port: pick another one
        raise PostfixError(f"Postfix did not start{self._log_tail()}")

    def _wait_ready(self, mark: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "fatal:" in self._read_from(mark):
                return False
            with contextlib.suppress(OSError):
                with socket.create_connection((self.host, self.port), timeout=2) as s:
                    banner = s.recv(512).decode(errors="replace")
                    s.sendall(b"QUIT\r\n")
                if self.hostname in banner:
                    return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """``postfix -c DIR stop``: only this instance's master and its children."""
        if not self.running:
            return
        self._postfix("stop", check=False)
        pid_file = self.root / "queue" / "pid" / "master.pid"
        deadline = time.monotonic() + 20
        while pid_file.exists() and time.monotonic() < deadline:
            try:
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, 0)
            except (OSError, ValueError, IndexError):
                break
            time.sleep(0.05)
        self._wait_closed()
        self.running = False

    def _wait_closed(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
            except OSError:
                return
            time.sleep(0.05)

    def reload(self, timeout: float = 20) -> None:
        """``postfix reload`` and wait until the master logged that it re-read its files
        (new connections then get the new configuration; a kept-open session keeps the
        smtpd process, and so the configuration, it started with)."""
        if not self.running:
            return
        mark = self._size()
        self._postfix("reload")
        deadline = time.monotonic() + timeout
        while "reload -- version" not in self._read_from(mark):
            if time.monotonic() > deadline:
                raise PostfixError(f"Postfix did not reload{self._log_tail()}")
            time.sleep(0.02)
        time.sleep(0.1)  # let the old idle smtpd processes exit

    def close(self) -> None:
        """Stop the instance and remove its directory."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def reset(self) -> None:
        """Back to the state a test starts from (see the module docstring)."""
        if not self.running:
            self._overrides.clear()
            self._added_services.clear()
            self._reset_maps()
            self._reset_users()
            self.start()
        elif self._dirty:
            self._overrides.clear()
            self._added_services.clear()
            self._reset_maps()
            self._write_config()
            self.reload()
        self._reset_users()
        self._dirty = False
        self.flush_queue()
        self.clear_mailbox()
        self.mark()

    # --- queue and mailbox ---------------------------------------------------------------

    def flush_queue(self) -> None:
        """Delete every queued message (deferred or not)."""
        if self.running:
            subprocess.run(["postsuper", "-c", str(self.config_dir), "-d", "ALL"],
                           capture_output=True, timeout=30)

    def queue_ids(self) -> set[str]:
        """The queue IDs in this instance's queue (incoming, active, deferred, hold). The
        queue manager moves a message between those folders by renaming its file (same
        name), so one walk may see it twice, or not at all; walks are repeated until two
        agree."""
        last: set[str] | None = None
        for _ in range(50):
            ids = {p.name for sub in ("incoming", "active", "deferred", "hold")
                   for p in (self.root / "queue" / sub).rglob("*") if p.is_file()}
            if ids == last:
                break
            last = ids
            time.sleep(0.01)
        return ids

    def queue_size(self) -> int:
        """Messages in this instance's queue (see :meth:`queue_ids`)."""
        return len(self.queue_ids())

    def clear_mailbox(self) -> None:
        for p in (self.mailbox_dir / "new").iterdir():
            p.unlink(missing_ok=True)

    def messages(self) -> list[Delivered]:
        """Every message delivered so far (since the last reset), oldest first."""
        found = []
        for path in sorted((self.mailbox_dir / "new").iterdir(),
                           key=lambda p: (p.stat().st_mtime_ns, p.name)):
            raw = path.read_bytes()
            sender, recipient, queue_id, data = raw.split(b"\n", 3)
            found.append(Delivered(sender=sender.decode(), recipient=recipient.decode(),
                                   queue_id=queue_id.decode(), data=data, path=path))
        return found

    def wait_for_messages(self, n: int, timeout: float = 30) -> list[Delivered]:
        """Wait until at least ``n`` messages were delivered; returns them all."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.messages()
            if len(found) >= n or time.monotonic() > deadline:
                if len(found) < n:
                    raise AssertionError(f"{len(found)} of {n} messages delivered after "
                                         f"{timeout}s{self._log_tail()}")
                return found
            time.sleep(0.05)

    # --- the log -------------------------------------------------------------------------

    def _size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def _read_from(self, offset: int) -> str:
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def mark(self) -> None:
        """From now on, :meth:`log` returns only newer lines."""
        self._mark = self._size()

    def log(self) -> list[str]:
        """Postfix's own log lines since the last :meth:`mark` (or reset)."""
        return self._read_from(self._mark).splitlines()

    def log_entries(self, program: str | None = None) -> list[LogEntry]:
        """Parsed log lines since the mark; ``program`` e.g. ``"smtpd"`` filters."""
        entries = [e for e in map(parse_log_line, self.log()) if e is not None]
        if program is not None:
            entries = [e for e in entries if e.program.endswith(f"/{program}")]
        return entries

    def count(self, pattern: str) -> int:
        """Log lines since the mark matching the regex ``pattern``."""
        regex = re.compile(pattern)
        return sum(1 for line in self.log() if regex.search(line))

    def accepted_times(self) -> list[dt.datetime]:
        """When the relay queued each message since the mark, by the relay's own clock to
        the microsecond: decoded from the long queue ID of cleanup's ``message-id=`` line
        (the time smtpd created the queue file for it, at its first accepted RCPT)."""
        times = []
        for entry in self.log_entries("cleanup"):
            if "message-id=" in entry.text:
                queue_id = entry.text.split(":", 1)[0]
                times.append(queue_id_time(queue_id) or entry.at)
        return sorted(times)

    def wait_for_log(self, pattern: str, count: int = 1, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.count(pattern) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {count} log line(s) matching {pattern!r} "
                                     f"after {timeout}s{self._log_tail()}")
            time.sleep(0.05)

    # --- for SendDock ----------------------------------------------------------------------

    def smtp_url(self, user: str | None = None, password: str | None = None, *,
                 tls: str = "none", **params: str) -> str:
        """A ``SENDDOCK_SMTP_URL`` for this instance (credentials percent-encoded)."""
        from urllib.parse import quote

        auth = ""
        if user is not None:
            auth = quote(user, safe="")
            if password is not None:
                auth += ":" + quote(password, safe="")
            auth += "@"
        query = "&".join([f"tls={tls}", *(f"{k}={v}" for k, v in params.items())])
        return f"smtp://{auth}{self.host}:{self.port}?{query}"


_SAFE_ALPHABET = "0123456789BCDFGHJKLMNPQRSTVWXYZbcdfghjklmnpqrstvwxyz"  # base 52


def queue_id_time(queue_id: str) -> dt.datetime | None:
    """The (local) time encoded in a Postfix long queue ID (``enable_long_queue_ids``):
    6+ base-52 digits of seconds, 4 of microseconds, then ``z`` and the inode number."""
    head, sep, _inode = queue_id.rpartition("z")
    if not sep or len(head) < 10 or any(c not in _SAFE_ALPHABET for c in head):
        return None

    def number(digits: str) -> int:
        n = 0
        for c in digits:
            n = n * 52 + _SAFE_ALPHABET.index(c)
        return n

    seconds, micros = number(head[:-4]), number(head[-4:])
    return dt.datetime.fromtimestamp(seconds) + dt.timedelta(microseconds=micros)


def max_per_second(times: Iterable[dt.datetime]) -> int:
    """The most messages within one calendar second (``times`` truncated to seconds)."""
    counts: dict[dt.datetime, int] = {}
    for t in times:
        second = t.replace(microsecond=0)
        counts[second] = counts.get(second, 0) + 1
    return max(counts.values(), default=0)


def max_in_window(times: Iterable[dt.datetime], seconds: float = 1.0) -> int:
    """The most messages in any sliding window of ``seconds`` (half-open)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while (t - ordered[start]).total_seconds() >= seconds:
            start += 1
        best = max(best, end - start + 1)
    return best


@contextlib.contextmanager
def running(*, main_cf: dict[str, str] | None = None,
            services: dict[str, str] | None = None) -> Iterator[Postfix]:
    """A started instance for a ``with`` block (stopped and removed after)."""
    instance = Postfix(main_cf=main_cf, services=services)
    try:
        instance.start()
        instance.reset()
        yield instance
    finally:
        instance.close()


__all__ = ["INSTALL_HINT", "PASSWORD", "USER", "Delivered", "LogEntry", "Postfix",
           "PostfixError", "make_certificates", "max_in_window", "max_per_second", "parse_log_line",
           "queue_id_time",
           "running", "unavailable_reason"]
