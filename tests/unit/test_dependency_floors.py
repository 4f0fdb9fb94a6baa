"""Dependency floors that exclude known-vulnerable releases, and a check that what is
installed honours every floor pyproject.toml declares.

Jinja2 < 3.1.6 has published sandbox escapes (CVE-2024-56201, CVE-2024-56326,
CVE-2025-27516); the sandbox is the trust boundary for marketers' templates. Werkzeug and
waitress floors are at or above their last security fixes (Werkzeug 3.0.6: CVE-2024-49766
and 49767; 3.1.4 and 3.1.6: CVE-2025-66221, CVE-2026-27199; waitress 3.0.1: CVE-2024-49768
and 49769; 3.0.2 is waitress's current release).
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
SECURITY_FLOORS = {"jinja2": "3.1.6", "werkzeug": "3.1.6", "waitress": "3.0.2"}


def _requirements() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    declared = list(project["dependencies"])
    for extra in ("dev",):
        declared += project.get("optional-dependencies", {}).get(extra, [])
    return [Requirement(line) for line in declared]


def _floor(req: Requirement) -> Version | None:
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(floors) if floors else None


def test_pyproject_keeps_the_security_floors() -> None:
    by_name = {r.name.lower(): r for r in _requirements()}
    for name, minimum in SECURITY_FLOORS.items():
        floor = _floor(by_name[name])
        assert floor is not None and floor >= Version(minimum), \
            f"{name}: pyproject must require >= {minimum} (known vulnerabilities below)"


@pytest.mark.parametrize("req", _requirements(), ids=lambda r: r.name)
def test_the_installed_version_is_not_below_its_floor(req: Requirement) -> None:
    if req.marker is not None and not req.marker.evaluate({"extra": "dev"}):
        pytest.skip(f"{req.name} is not for this environment")
    try:
        installed = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        pytest.fail(f"{req.name} is declared in pyproject.toml but not installed")
    assert req.specifier.contains(installed, prereleases=True), \
        f"{req.name} {installed} is installed, pyproject.toml wants {req.specifier}"
