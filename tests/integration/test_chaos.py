"""The chaos script in miniature (bench/chaos.py, run as the bench runs it): real
`senddock worker` processes SIGKILLed at random moments mid-drain, a sink process
recording every message. P2 (nobody lost, nothing stuck), P3 (duplicates within the
measured in-flight bound, same Message-ID), P4 (restarts take back their predecessor's
jobs), P8 (counts = the record)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_random_sigkills_lose_nobody(pg_server: str, tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--recipients", "3000",
         "--kills", "4", "--workers", "2", "--threads", "5", "--gap", "0.2", "1.0",
         "--database-url", pg_server, "--seed", "7", "--json", str(out)],
        capture_output=True, text=True, timeout=1200, cwd=ROOT)
    print(run.stdout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["broken"] == []
    assert len(report["kills"]) == 4
    assert report["recipients"] == report["delivered"] == 3000
    assert report["lost"] == 0 and report["not_terminal"] == 0
    assert report["duplicates"] <= report["in_flight_bound"]
    assert report["counts"]["sent"] == report["sink_distinct"] == 3000
    # The kills hit workers holding claimed jobs, so the at-least-once window was open.
    assert report["in_flight_bound"] > 0
