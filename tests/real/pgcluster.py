"""Private PostgreSQL clusters for fault tests: Debian's server binaries, run as the
``postgres`` OS user, data in a temp dir we own, on a free loopback port.

Never the shared server on 5432: every cluster here is initdb'd by us, listens on a port
we picked, and is stopped by us. A cluster is cheap per test: the session initdb's one
template data directory (with a migrated ``senddock`` database in it) and each cluster is
a copy of it, started with the settings the test asks for (``max_connections``, ...).

- :class:`PgCluster` — one server: ``start``/``stop(mode)``/``promote``/``configure``,
  ``url()``, ``execute()``, ``log()`` (the server's own log, for assertions).
- :func:`standby_of` — a streaming standby of a running primary, through a physical
  replication slot, synchronous (``synchronous_standby_names``) unless told otherwise.
- :class:`SmallDisk` — a size-limited tmpfs mounted (and unmounted) by us, for disk-full
  tests: a tablespace on it makes every write of a database moved there fail with 53100.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

INSTALL_HINT = "apt-get install postgresql (Debian's server binaries, /usr/lib/postgresql/*/bin)"
OS_USER = "postgres"
DATABASE = "senddock"
# SendDock connects as an ordinary role (owner of its database), as in production: a
# superuser could use the slots superuser_reserved_connections keeps back.
APP_ROLE = "senddock"

# For every cluster: loopback only, small, quick to start and stop. fsync is off because
# the faults these tests make are process-level (kill, stop -m immediate, ENOSPC): the
# kernel's page cache survives them, so durability across them does not need fsync.
BASE_SETTINGS: dict[str, Any] = {
    "listen_addresses": "127.0.0.1",
    "max_connections": 40,
    "shared_buffers": "16MB",
    "fsync": "off",
    "full_page_writes": "off",
    "wal_level": "replica",
    "max_wal_senders": 5,
    "max_replication_slots": 5,
    "hot_standby": "on",
    "wal_keep_size": "64MB",
    "checkpoint_timeout": "300s",
    "log_line_prefix": "%m [%p] %a %e ",
    "log_connections": "off",
    "log_min_messages": "warning",
    "log_min_error_statement": "panic",
    "autovacuum": "off",
}


def find_bindir() -> Path | None:
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


def unavailable_reason() -> str | None:
    """Why private clusters cannot run here (None when they can)."""
    if find_bindir() is None:
        return INSTALL_HINT
    if os.geteuid() != 0:
        return "private PostgreSQL clusters run initdb/pg_ctl as the postgres user: run as root"
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        return f"no {OS_USER!r} OS user ({INSTALL_HINT})"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _owner() -> tuple[int, int]:
    entry = pwd.getpwnam(OS_USER)
    return entry.pw_uid, entry.pw_gid


def _chown_tree(path: Path) -> None:
    uid, gid = _owner()
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


def run_as_postgres(args: list[str], *, check: bool = True, timeout: float = 120,
                    cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a server binary as the postgres OS user (initdb and postgres refuse root)."""
    uid, gid = _owner()
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "HOME": str(cwd or "/tmp")}
    result = subprocess.run(args, user=uid, group=gid, extra_groups=[], env=env,
                            cwd=cwd or "/tmp", capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n"
                           f"{result.stdout}\n{result.stderr}")
    return result


def make_root(prefix: str) -> Path:
    """A temp dir the postgres user can use (pytest's tmp_path is root-only)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    _chown_tree(root)
    return root


def _conf_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


class PgCluster:
    """One private PostgreSQL server. Owns its data dir and port; stops only itself."""

    def __init__(self, bindir: Path, root: Path, name: str, port: int | None = None) -> None:
        self.bindir = bindir
        self.root = root
        self.name = name
        self.datadir = root / name
        self.port = port or free_port()
        self.logfile = root / f"{name}.log"
        self.started = False

    # --- creation ----------------------------------------------------------------------

    def initdb(self) -> None:
        run_as_postgres([str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                         "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync",
                         "--no-instructions"], cwd=self.root)
        self.configure(BASE_SETTINGS)

    def copy_from(self, template: Path) -> None:
        """This cluster's data dir as a copy of a stopped template's."""
        shutil.copytree(template, self.datadir, symlinks=True)
        _chown_tree(self.datadir)
        self.datadir.chmod(0o700)
        for stale in ("postmaster.pid", "postmaster.opts"):
            (self.datadir / stale).unlink(missing_ok=True)

    def configure(self, settings: dict[str, Any]) -> None:
        """Append settings to postgresql.conf (later lines win). Takes effect on the next
        start, or :meth:`reload` for the reloadable ones."""
        lines = [f"{key} = {_conf_value(value)}\n" for key, value in settings.items()]
        conf = self.datadir / "postgresql.conf"
        with open(conf, "a") as fh:
            fh.write(f"# --- tests/real/pgcluster.py ({self.name})\n")
            fh.writelines(lines)

    # --- lifecycle ---------------------------------------------------------------------

    def _pg_ctl(self, *args: str, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args],
                               check=check, timeout=timeout, cwd=self.root)

    def start(self, **settings: Any) -> PgCluster:
        """Start on this cluster's port (plus ``settings``); wait until it accepts."""
        opts = {"port": self.port, "unix_socket_directories": str(self.root),
                "cluster_name": self.name, **settings}
        self.configure(opts)
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.logfile))
        self.started = True
        return self

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast|immediate|smart``. ``immediate`` is a crash: no
        checkpoint, no goodbye to the clients (they see the connection drop)."""
        if self.running():
            self._pg_ctl("stop", "-w", "-t", "60", "-m", mode, check=False)
        self.started = False

    def restart(self, **settings: Any) -> None:
        self.stop()
        self.start(**settings)

    def reload(self) -> None:
        self._pg_ctl("reload")

    def promote(self, timeout: float = 60) -> None:
        """Promote a standby to primary and wait until it accepts writes."""
        self._pg_ctl("promote", "-w", "-t", str(int(timeout)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                if self.execute("SELECT NOT pg_is_in_recovery()")[0][0]:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not leave recovery within {timeout}s")

    def running(self) -> bool:
        pid = self.datadir / "postmaster.pid"
        if not pid.exists():
            return False
        return self._pg_ctl("status", check=False).returncode == 0

    # --- talking to it -----------------------------------------------------------------

    def url(self, database: str = DATABASE, user: str = APP_ROLE, **params: str) -> str:
        """A URL to this cluster: by default SendDock's own (non-superuser) role."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}" + (
            f"?{query}" if query else "")

    def execute(self, sql: str, params: Any = None, database: str = DATABASE,
                connect_timeout: int = 5) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit; its rows (empty for commands)."""
        with psycopg.connect(self.url(database, user="postgres"), autocommit=True,
                             connect_timeout=connect_timeout,
                             application_name="tests-pgcluster") as conn:
            cur = conn.execute(sql, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def log(self) -> str:
        """The server's own log so far."""
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""

    def __repr__(self) -> str:
        return f"PgCluster({self.name!r}, port={self.port})"


def standby_of(primary: PgCluster, name: str = "standby", *, synchronous: bool = True,
               timeout: float = 60) -> PgCluster:
    """A streaming standby of ``primary`` through replication slot ``name``, started.
    Synchronous: the primary's commits wait until this standby has flushed them
    (``synchronous_standby_names``, ``synchronous_commit = on``)."""
    standby = PgCluster(primary.bindir, primary.root, name)
    primary.execute("SELECT pg_create_physical_replication_slot(%s)", (name,),
                    database="postgres")
    run_as_postgres([str(primary.bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                     str(primary.port), "-U", "postgres", "-D", str(standby.datadir),
                     "-X", "stream", "-S", name, "--no-sync", "-c", "fast"],
                    cwd=primary.root, timeout=timeout)
    (standby.datadir / "standby.signal").touch()
    _chown_tree(standby.datadir)
    standby.configure({
        "primary_conninfo": f"host=127.0.0.1 port={primary.port} user=postgres "
                            f"application_name={name}",
        "primary_slot_name": name,
    })
    standby.start()
    if synchronous:
        primary.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{name}'",
                        database="postgres")
        primary.reload()
    want = "sync" if synchronous else "async"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = primary.execute("SELECT sync_state FROM pg_stat_replication "
                               "WHERE application_name = %s AND state = 'streaming'",
                               (name,), database="postgres")
        if rows and rows[0][0] == want:
            return standby
        time.sleep(0.1)
    raise RuntimeError(f"standby {name} not streaming ({want}) within {timeout}s:\n"
                       f"{standby.log()[-2000:]}")


class SmallDisk:
    """A size-limited tmpfs we mount and unmount ourselves (root), owned by postgres.

    ``fill()`` leaves ``keep`` bytes free (a root-owned filler file), ``free()`` removes
    the filler so writes succeed again.
    """

    def __init__(self, size: str = "16m") -> None:
        self.path = Path(tempfile.mkdtemp(prefix="senddock-smalldisk-", dir="/tmp"))
        self.path.chmod(0o755)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(self.path)], check=True, capture_output=True, timeout=30)
        self.mounted = True
        uid, gid = _owner()
        os.chown(self.path, uid, gid)
        self.filler = self.path / "filler"

    def directory(self, name: str) -> Path:
        """A postgres-owned directory on the small disk (e.g. for a tablespace)."""
        d = self.path / name
        d.mkdir(mode=0o700)
        uid, gid = _owner()
        os.chown(d, uid, gid)
        return d

    def fill(self, keep: int = 0) -> None:
        """Write the filler until the disk is full, then give back ``keep`` bytes."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (1 << 20, 4096, 512):
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * size) == size:
                        pass
        finally:
            os.close(fd)
        if keep:
            size = self.filler.stat().st_size
            os.truncate(self.filler, max(0, size - keep))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False,
                           capture_output=True, timeout=30)
            self.mounted = False
        with contextlib.suppress(OSError):
            self.path.rmdir()


class Clusters:
    """Makes clusters for one test from the session's template; stops what it made."""

    def __init__(self, bindir: Path, template: Path) -> None:
        self.bindir = bindir
        self.template = template
        self.root = make_root("senddock-pgc-")
        self.made: list[PgCluster] = []
        self.disks: list[SmallDisk] = []

    def primary(self, name: str = "primary", **settings: Any) -> PgCluster:
        """A started cluster (copy of the template: a migrated ``senddock`` database)."""
        cluster = PgCluster(self.bindir, self.root, name)
        cluster.copy_from(self.template)
        self.made.append(cluster)
        return cluster.start(**settings)

    def standby(self, primary: PgCluster, name: str = "standby", *,
                synchronous: bool = True) -> PgCluster:
        cluster = standby_of(primary, name, synchronous=synchronous)
        self.made.append(cluster)
        return cluster

    def small_disk(self, size: str = "16m") -> SmallDisk:
        disk = SmallDisk(size)
        self.disks.append(disk)
        return disk

    def close(self) -> None:
        for cluster in reversed(self.made):
            with contextlib.suppress(Exception):
                cluster.stop("immediate")
        for disk in self.disks:
            disk.unmount()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def template_cluster(bindir: Path, migrate: Any = None) -> Iterator[Path]:
    """initdb once, create the ``senddock`` database, run ``migrate(url)`` on it, stop:
    the data dir every per-test cluster copies."""
    root = make_root("senddock-pgtpl-")
    try:
        cluster = PgCluster(bindir, root, "template")
        cluster.initdb()
        cluster.start()
        try:
            cluster.execute(f"CREATE ROLE {APP_ROLE} LOGIN", database="postgres")
            cluster.execute(f"CREATE DATABASE {DATABASE} OWNER {APP_ROLE}",
                            database="postgres")
            if migrate is not None:
                migrate(cluster.url())
        finally:
            cluster.stop("fast")
        yield cluster.datadir
    finally:
        shutil.rmtree(root, ignore_errors=True)
