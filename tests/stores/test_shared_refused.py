"""A store without shared holds refuses ``mode="shared"`` with InvalidInput, never taking a
reader as a writer. Every built-in store takes shared claims, so a store written outside
dibs (here a memory store that says it has none) is the one that refuses."""

from __future__ import annotations

from dibs.stores.memory import MemoryStore
from dibs.testing.shared import check_refused

QUICK = True


class NoReaders(MemoryStore):
    """A store as a plug-in without shared holds would be."""

    shared_holds = False


def test_shared_claims_are_refused_not_taken_as_exclusive() -> None:
    store = NoReaders()
    assert not store.shared_holds
    check_refused(store)
