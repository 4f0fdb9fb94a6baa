"""``senddock demo`` stops its own PostgreSQL when it stops: nothing is left
running behind the user's back, and the output says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, wait_for


@pytest.mark.slow
def test_stopping_the_demo_stops_its_postgresql(tmp_path: Path,
                                                spawn: Callable[..., Any]) -> None:
    data_dir = tmp_path / "demo"
    proc = spawn(["demo", "--port", str(free_port()), "--smtp-port", str(free_port()),
                  "--subscribers", "20"], {"DATA_DIR": str(data_dir)})
    # "listening" is printed once the signal handlers are in place (serve_app); a SIGTERM
    # before that would end the process the default way.
    wait_for(lambda: "SendDock listening on" in proc.output() or proc.popen.poll() is not None,
             timeout=120, message="the demo to start")
    assert proc.popen.poll() is None, proc.output()
    assert (data_dir / "pgdata" / "postmaster.pid").exists()
    assert proc.terminate(timeout=60) == 0, proc.output()
    assert "Stopped the demo's PostgreSQL" in proc.output()
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()
