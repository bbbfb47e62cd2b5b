"""One parametrized ``store`` fixture runs every test against every store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dibs
from dibs import FakeClock, Store

STORE_KINDS = ["memory", "sqlite"]
"""Every store the contract runs on; the PostgreSQL fixtures add "postgresql"."""


class StoreMaker:
    """Opens stores of one kind onto one shared place (a file, a database)."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.opened: list[Store] = []
        self._memory: Store | None = None

    @property
    def url(self) -> str:
        """A URL that other processes can open (not for memory://)."""
        if self.kind == "sqlite":
            return f"sqlite:///{self.tmp_path / 'dibs.db'}"
        raise NotImplementedError(self.kind)

    def __call__(self, clock: FakeClock | None = None, **options: object) -> Store:
        if self.kind == "memory":
            if self._memory is None:
                self._memory = dibs.open("memory://", clock=clock, **options)
                self.opened.append(self._memory)
            return self._memory
        store = dibs.open(self.url, clock=clock, **options)
        self.opened.append(store)
        return store

    def close(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(store_kind: str, tmp_path: Path) -> Iterator[StoreMaker]:
    maker = StoreMaker(store_kind, tmp_path)
    yield maker
    maker.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(make_store: StoreMaker, clock: FakeClock) -> Store:
    return make_store(clock)


@pytest.fixture
def reopen(make_store: StoreMaker, clock: FakeClock) -> Callable[[], Store]:
    return lambda: make_store(clock)
