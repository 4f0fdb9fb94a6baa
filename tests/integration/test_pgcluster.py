"""The private-cluster fixtures do what the fault tests rely on, checked in PostgreSQL's
own catalogs: per-test settings, a synchronous streaming standby that can be promoted,
and a small disk that fills up with SQLSTATE 53100."""

from __future__ import annotations

import psycopg
import pytest

from harness.pgcluster import Clusters

pytestmark = pytest.mark.slow


def test_primary_standby_promote_and_full_disk(pg_clusters: Clusters) -> None:
    primary = pg_clusters.primary(max_connections=12)
    assert primary.port != 5432
    assert primary.execute("SHOW max_connections") == [("12",)]
    assert primary.execute("SELECT count(*) > 0 FROM alembic_version")[0][0]

    standby = pg_clusters.standby(primary)
    assert primary.execute("SELECT sync_state FROM pg_stat_replication",
                           database="postgres") == [("sync",)]
    primary.execute("CREATE TABLE fixture_probe (x int)")
    primary.execute("INSERT INTO fixture_probe VALUES (1)")
    # Synchronous: the commit above returned only once the standby had it.
    assert standby.execute("SELECT count(*) FROM fixture_probe") == [(1,)]
    with pytest.raises(psycopg.Error) as read_only:
        standby.execute("INSERT INTO fixture_probe VALUES (2)")
    assert read_only.value.sqlstate == "25006"

    primary.stop("immediate")
    assert not primary.running()
    standby.promote()
    standby.execute("INSERT INTO fixture_probe VALUES (2)")
    assert standby.execute("SELECT count(*) FROM fixture_probe") == [(2,)]

    disk = pg_clusters.small_disk("8m")
    standby.execute(f"CREATE TABLESPACE small LOCATION '{disk.directory('ts')}'",
                    database="postgres")
    standby.execute("CREATE TABLE on_small (x text) TABLESPACE small")
    disk.fill()
    with pytest.raises(psycopg.Error) as full:
        standby.execute("INSERT INTO on_small SELECT repeat('x', 1000) "
                        "FROM generate_series(1, 20000)")
    assert full.value.sqlstate == "53100"
    disk.free()
    standby.execute("INSERT INTO on_small VALUES ('fits again')")
