"""memory:// internals the contract cannot see: its indexes under races and after purges."""

from __future__ import annotations

from dibs import FakeClock, Span, Unit
from dibs.stores.memory import MemoryStore


def test_an_expired_hold_leaves_the_indexes_when_it_is_purged() -> None:
    """Swept holds keep their index entries (the reason rule) only until their purge."""
    clock = FakeClock()
    store = MemoryStore(clock=clock, request_retention=10)
    for i in range(50):
        store.claim([Unit("seat", str(i)), Span("room", i, i + 1)], holder=f"h{i}", ttl=1)
    clock.advance(2)
    assert store.sweep().expired == 50
    assert len(store._units) == 50 and len(store._spans["room"]) == 50
    store.claim(Unit("keeper", ""), holder="keeper")  # the newest claim is kept
    clock.advance(10)
    assert store.sweep().purged_claims == 50
    assert list(store._units) == [Unit("keeper", "")]
    assert store._spans == {}
    assert list(store._by_holder) == ["keeper"]
