"""Shared holds (``mode="shared"``): the contract on every store that takes them, both faces;
the refusal on the others."""

from __future__ import annotations

import sys

import pytest

from dibs.testing.shared import SharedHoldContract

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

SHARED_KINDS = ["memory", "sqlite", "etcd", "aio-memory", "aio-sqlite", "aio-etcd"]


@pytest.fixture(params=SHARED_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """The stores that take shared claims, and each again through :func:`dibs.aio.open`."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _fine_switching() -> object:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


class TestSharedHolds(SharedHoldContract):
    pass
