"""The built wheel works outside the checkout: templates, static files and migrations are
package data, so `pip install senddock-*.whl` gives a working `senddock` anywhere."""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, wait_for

pytestmark = pytest.mark.slow


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=300, **kwargs)  # type: ignore[call-overload]


def test_wheel_installs_and_serves_outside_the_checkout(tmp_path: Path, db_url: str) -> None:
    built = _run(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", ROOT)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("senddock-*.whl"))
    # Every file of the engine ships, its sub-packages and the built-in mail templates
    # (package data of workers.building) included.
    shipped = set(zipfile.ZipFile(wheel).namelist())
    engine = [p.relative_to(ROOT).as_posix() for p in (ROOT / "workers").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts]
    assert "workers/building/mail_templates/verification.html" in engine
    assert [name for name in engine if name not in shipped] == []

    # A fresh venv with the wheel alone; its dependencies come from the test venv's
    # site-packages through a .pth line (a plain path: the checkout's editable finder,
    # which lives in a .pth of its own there, is not loaded).
    venv = tmp_path / "venv"
    assert _run(sys.executable, "-m", "venv", venv).returncode == 0
    py = venv / "bin" / "python"
    installed = _run(py, "-m", "pip", "install", "--no-deps", "--quiet",
                     "--disable-pip-version-check", wheel)
    assert installed.returncode == 0, installed.stderr[-2000:]
    purelib = _run(py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    target = Path(purelib.stdout.strip())
    (target / "zz_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDDOCK_")}
    env.update(SENDDOCK_DATABASE_URL=db_url, SENDDOCK_SECRET_KEY="wheel-test-secret",
               SENDDOCK_SMTP_URL="smtp://127.0.0.1:1?tls=none", SENDDOCK_WORKERS="1",
               PYTHONPATH="")
    where = _run(py, "-c", "import webapp, workers; print(webapp.__file__, workers.__file__)",
                 cwd=outside, env=env)
    assert str(target) in where.stdout and str(ROOT) not in where.stdout, where

    senddock = [venv / "bin" / "senddock"]
    upgraded = _run(*senddock, "db", "upgrade", cwd=outside, env=env)
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]

    port = free_port()
    server = subprocess.Popen([str(a) for a in (*senddock, "serve", "--port", port)],
                              cwd=outside, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return urllib.request.urlopen(f"{base}/healthz", timeout=2).status == 200
            except OSError:
                return False

        wait_for(up, timeout=60, message="the installed wheel's server did not come up")
        page = urllib.request.urlopen(f"{base}/login", timeout=5).read().decode()
        assert "Sign in" in page or "Log in" in page or "password" in page.lower()
        assets = re.findall(r'(?:href|src)="(/static/[^"]+)"', page)
        assert any(a.endswith(".css") for a in assets), assets
        assert any("htmx" in a for a in assets), assets
        for asset in assets:
            with urllib.request.urlopen(f"{base}{asset}", timeout=5) as response:
                assert response.status == 200 and len(response.read()) > 100, asset
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            time.sleep(0.5)
