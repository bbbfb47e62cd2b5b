"""The store contract from :mod:`dibs.testing`, on every store, sync and async faces."""

from __future__ import annotations

import pytest

from conftest import ALL_STORE_KINDS
from dibs.testing import StoreContract

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)


@pytest.fixture(params=ALL_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every store, and every store again through :func:`dibs.aio.open` (support/aio_face.py)."""
    return str(request.param)


class TestStoreContract(StoreContract):
    pass
