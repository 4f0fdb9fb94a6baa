"""Schemathesis, the third-party OpenAPI fuzzer, agrees with the API (P9).

A real ``senddock web`` (waitress) serves a fresh database; the ``st`` command runs every
check (server errors, status codes, content types, response schemas, schema-valid bodies
accepted, schema-invalid ones refused, 405 with ``Allow``, auth ignored, use after free,
...) in every phase (coverage, fuzzing, stateful through the document's links) over every
operation, once with an admin's token and once with a support user's. Zero failures.

Schemathesis runs as it comes: every check (``--checks all``), its default expectations,
no configuration file and no check of ours — the document says what the server checks.

Bounded by counts, never by time left (a time budget skipped the stateful phase on a busy
machine): ``SENDDOCK_SCHEMATHESIS_EXAMPLES`` (default 25) examples per operation and as
many stateful scenarios, of Schemathesis's default number of steps each;
``SENDDOCK_SCHEMATHESIS_SEED`` (default fixed, so a failure reproduces; ``random`` for a
new one each run). The probe's longer run: examples 1000.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import free_port, settings, wait_for
from webapp import openapi

EXAMPLES = os.environ.get("SENDDOCK_SCHEMATHESIS_EXAMPLES", "25")
SEED = os.environ.get("SENDDOCK_SCHEMATHESIS_SEED", "18")


def _st() -> str:
    found = shutil.which("st", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    return found


@pytest.fixture()
def served(db_url: str, sink: Any, spawn: Callable[..., Any]) -> str:
    port = free_port()
    proc = spawn(["web", "--port", str(port)], settings(db_url, sink.port, WORKERS="0"))
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.popen.poll() is None, proc.output()
        try:
            return requests.get(f"{base}/healthz", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    wait_for(up, timeout=30, message="senddock web")
    return base


@pytest.mark.slow
@pytest.mark.timeout(1800)  # counts bound the run; this only stops one that hangs
@pytest.mark.parametrize("role", ["admin", "support"])
def test_schemathesis_finds_nothing(role: str, served: str, tmp_path: Path,
                                    make_user: Callable[..., dict[str, Any]]) -> None:
    token = make_user(role)["token"]
    seed = [] if SEED == "random" else ["--seed", SEED]
    command = [_st(), "run", f"{served}/api/v1/openapi.json",
               "--header", f"Authorization: Bearer {token}", "--checks", "all",
               "--phases", "coverage,fuzzing,stateful", "--max-examples", EXAMPLES,
               "--workers", "1", *seed, "--report", "junit", "--report-dir", str(tmp_path)]
    # No time budget: the timeout only stops a run that hangs (generous for a busy machine).
    run = subprocess.run(command, capture_output=True, text=True, timeout=1800,
                         cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"})
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"schemathesis ({role}) found problems:\n{output[-20000:]}"
    summary = output[output.rfind("SUMMARY"):]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in summary, f"{phase} phase did not run clean:\n{summary}"
    operations = sum(1 for item in openapi.document()["paths"].values()
                     for method in item if method in ("get", "post", "put", "patch", "delete"))
    # Every operation but the document's own URL, which Schemathesis leaves out.
    expected = operations - 1
    assert f"Selected: {expected}/{expected}" in summary and f"Tested: {expected}" in \
        summary, f"not every operation was tested:\n{summary}"
