"""The one URL check behind --collector and --remote-write."""

from __future__ import annotations

import pytest

from hpcml.urls import is_http_url


@pytest.mark.parametrize("url, ok", [
    ("http://centre:8787", True), ("https://vm.example/api/v1/write", True), ("http://[::1]:9090/w", True),
    ("ftp://centre:21", False), ("centre:8787", False), ("http://", False), ("http://[::1", False),
    ("http://centre:99999", False), ("", False),
])
def test_is_http_url(url, ok):
    assert is_http_url(url) is ok
