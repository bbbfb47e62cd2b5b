"""Shared holds (``mode="shared"``) on PostgreSQL: the contract, both faces (schema version 5)."""

from __future__ import annotations

import sys

import pytest

from dibs.testing.shared import SharedHoldContract


@pytest.fixture(params=["postgresql", "aio-postgresql"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """PostgreSQL, and again through :func:`dibs.aio.open`."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _fine_switching() -> object:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


class TestSharedHoldsOnPostgres(SharedHoldContract):
    pass
