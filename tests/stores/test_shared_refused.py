"""The stores without shared holds refuse ``mode="shared"`` with InvalidInput, both faces."""

from __future__ import annotations

import pytest

from dibs import Store
from dibs.testing.shared import check_refused


@pytest.fixture(params=["etcd", "aio-etcd"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_shared_claims_are_refused_not_taken_as_exclusive(store: Store) -> None:
    assert not store.shared_holds
    check_refused(store)
