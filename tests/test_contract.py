"""The store contract from :mod:`dibs.testing`, on every store."""

from __future__ import annotations

from dibs.testing import StoreContract


class TestStoreContract(StoreContract):
    pass
