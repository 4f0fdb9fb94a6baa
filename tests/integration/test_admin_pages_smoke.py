"""Every admin page renders for an admin (and refuses other roles)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import Browser

PAGES = ["/admin/suppressions", "/admin/audit", "/admin/users", "/inbox/", "/health/",
         "/health/?fragment=status"]


@pytest.mark.parametrize("path", PAGES)
def test_admin_sees_page(client: Any, make_user: Callable[..., dict[str, Any]],
                         path: str) -> None:
    browser = Browser(client, make_user("admin"))
    response = browser.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)[:3000]
