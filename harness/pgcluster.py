"""Private PostgreSQL clusters for fault tests and benches (on
:class:`webapp.pgserver.PostgresServer`): Debian's server binaries, run as the ``postgres``
OS user, data in a temp dir we own, on a free loopback port.

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
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from webapp.pgserver import PostgresServer, chown_tree, debian_bindir

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


def unavailable_reason() -> str | None:
    """Why private clusters cannot run here (None when they can)."""
    if debian_bindir() is None:
        return INSTALL_HINT
    if os.geteuid() != 0:
        return "private PostgreSQL clusters run initdb/pg_ctl as the postgres user: run as root"
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        return f"no {OS_USER!r} OS user ({INSTALL_HINT})"
    return None


def make_root(prefix: str) -> Path:
    """A temp dir the postgres user can use (pytest's tmp_path is root-only)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    chown_tree(root, OS_USER)
    return root


class PgCluster(PostgresServer):
    """One private server of Debian's binaries run as the postgres OS user, holding
    SendDock's database: :meth:`url` is SendDock's own (non-superuser) role's by default,
    :meth:`execute` runs in the ``senddock`` database."""

    def __init__(self, bindir: Path, root: Path, name: str, port: int | None = None) -> None:
        super().__init__(bindir, root, name, port=port, user=OS_USER)

    def initdb(self, settings: dict[str, Any] | None = None) -> None:
        super().initdb(BASE_SETTINGS if settings is None else settings)

    def url(self, database: str = DATABASE, user: str = APP_ROLE, **params: str) -> str:
        return super().url(database, user, **params)

    def execute(self, sql: str, params: Any = None, database: str = DATABASE,
                connect_timeout: int = 5) -> list[tuple[Any, ...]]:
        return super().execute(sql, params, database, connect_timeout)


def standby_of(primary: PgCluster, name: str = "standby", *, synchronous: bool = True,
               timeout: float = 60) -> PgCluster:
    """A streaming standby of ``primary`` through replication slot ``name``, started.
    Synchronous: the primary's commits wait until this standby has flushed them
    (``synchronous_standby_names``, ``synchronous_commit = on``)."""
    standby = PgCluster(primary.bindir, primary.root, name)
    primary.execute("SELECT pg_create_physical_replication_slot(%s)", (name,),
                    database="postgres")
    primary.run([str(primary.bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                 str(primary.port), "-U", "postgres", "-D", str(standby.datadir),
                 "-X", "stream", "-S", name, "--no-sync", "-c", "fast"], timeout=timeout)
    (standby.datadir / "standby.signal").touch()
    chown_tree(standby.datadir, OS_USER)
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
        entry = pwd.getpwnam(OS_USER)
        uid, gid = entry.pw_uid, entry.pw_gid
        os.chown(self.path, uid, gid)
        self.filler = self.path / "filler"

    def directory(self, name: str) -> Path:
        """A postgres-owned directory on the small disk (e.g. for a tablespace)."""
        d = self.path / name
        d.mkdir(mode=0o700)
        entry = pwd.getpwnam(OS_USER)
        uid, gid = entry.pw_uid, entry.pw_gid
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
