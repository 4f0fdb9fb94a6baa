"""Where the web app's shipped files are: templates, static files and migrations.

In a checkout they are the top-level ``templates/``, ``static/`` and ``migrations/``
folders; in an installed wheel they are package data inside ``webapp`` (pyproject maps
them there). One function answers for both, so nothing else builds a path to them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def resource_dir(name: str) -> Path:
    """The folder ``name`` (``templates``, ``static`` or ``migrations``)."""
    packaged = resources.files("webapp") / name
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = _CHECKOUT / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"SendDock's {name}/ folder is missing from this installation "
                            f"(looked in {packaged} and {checkout})")
