"""One parametrized ``store`` fixture runs every test against every store."""

from __future__ import annotations

import base64
import os
import random
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg_pool.base
import pytest

import dibs
from aio_face import open_face
from dibs import FakeClock, Store
from etcdserver import etcd_url, fresh_prefix  # the session's etcd member (tests/etcdserver.py)
from pg_fixtures import (  # PostgreSQL session fixtures (tests/pg_fixtures.py)
    drop_schema,
    pg_admin_url,
    pg_schema_url,
    pg_url,
    private_pg_server,
    schema_url,
)

__all__ = ["etcd_url", "pg_admin_url", "pg_schema_url", "pg_url", "private_pg_server"]

STORE_KINDS = ["memory", "sqlite", "postgresql", "etcd"]
"""Every store the contract runs on."""

AIO_STORE_KINDS = ["aio-memory", "aio-sqlite", "aio-postgresql", "aio-etcd"]
"""The same stores through :func:`dibs.aio.open`, driven by tests/aio_face.py's sync face.
Only the modules that check the contract and the input domain ask for them (they override
``store_kind`` with :data:`ALL_STORE_KINDS`); the rest run on the sync stores only."""

ALL_STORE_KINDS = STORE_KINDS + AIO_STORE_KINDS

QUICK_MODULES = frozenset(
    {
        "test_aio_patterns.py",
        "test_booking.py",
        "test_contract.py",
        "test_domain.py",
        "test_inputs.py",
        "test_job_tables.py",
        "test_lot.py",
        "test_matching.py",
        "test_memory.py",
        "test_migrations.py",
        "test_package.py",
        "test_paths.py",
        "test_singleflight.py",
        "test_sqlite.py",
        "test_tasks.py",
        "test_tasks_schedules.py",
    }
)
"""The day-to-day subset, ``pytest -m quick``: the store contract and the input domain on
every store, the patterns, in-process tasks. Tests marked ``slow`` (processes, long races)
are left out, and so is every module not named here (the service, ``dibs verify``, the
browser, the docs blocks and site): the whole suite, ``scripts/test``, runs those."""

# psycopg_pool jitters each new connection's expiry with the global `random`, on its
# own threads and tasks. Hypothesis checks that nothing moves the global generator
# while it draws, and reports the pool's move as a strategy using `random`
# (HypothesisDeprecationWarning, an error here): a flaky failure of any Hypothesis
# test that runs beside a pool. In tests the pool gets a generator of its own.
psycopg_pool.base.random = random.Random().random  # type: ignore[attr-defined]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "quick: the day-to-day subset (conftest.QUICK_MODULES)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in QUICK_MODULES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)


class StoreMaker:
    """Opens stores of one kind onto one shared place (a file, a database)."""

    def __init__(
        self, kind: str, tmp_path: Path, pg_url: str | None = None, etcd_url: str | None = None
    ) -> None:
        self.aio = kind.startswith("aio-")
        self.kind = kind.removeprefix("aio-")
        self.tmp_path = tmp_path
        self.pg_url = pg_url
        self.pg_schema = f"t_{secrets.token_hex(6)}"  # a fresh schema per test
        self.etcd_url = etcd_url
        self.etcd_prefix = fresh_prefix()  # a fresh key prefix per test
        self.opened: list[Store] = []
        self._memory: Store | None = None

    @property
    def url(self) -> str:
        """A URL that other processes can open (not for memory://)."""
        if self.kind == "sqlite":
            return f"sqlite:///{self.tmp_path / 'dibs.db'}"
        if self.kind == "postgresql" and self.pg_url is not None:
            return schema_url(self.pg_url, self.pg_schema)
        if self.kind == "etcd" and self.etcd_url is not None:
            return f"{self.etcd_url}/{self.etcd_prefix}"
        raise NotImplementedError(self.kind)

    def __call__(self, clock: FakeClock | None = None, **options: object) -> Store:
        if self.kind == "memory":
            if self._memory is None:
                self._memory = self._open("memory://", clock, options)
                self.opened.append(self._memory)
            return self._memory
        store = self._open(self.url, clock, options)
        self.opened.append(store)
        return store

    def _open(self, url: str, clock: FakeClock | None, options: dict[str, object]) -> Store:
        if self.aio:
            # The async store behind the sync API: the same tests, the async face's answers.
            return open_face(url, clock=clock, **options)  # type: ignore[return-value]
        return dibs.open(url, clock=clock, **options)

    def close(self) -> None:
        for store in self.opened:
            store.close()
        if self.kind == "postgresql" and self.pg_url is not None:
            drop_schema(self.pg_url, self.pg_schema)
        if self.kind == "etcd" and self.etcd_url is not None:
            drop_etcd_prefix(self.etcd_url, self.etcd_prefix)


def drop_etcd_prefix(url: str, prefix: str) -> None:
    """Delete every key a test's etcd store wrote (its prefix), keeping the session member small."""
    endpoint = url.removeprefix("etcd://").split(",")[0].split("/")[0]
    start = base64.b64encode(prefix.encode() + b"/").decode()
    end = base64.b64encode(prefix.encode() + b"0").decode()  # "0" follows "/"
    httpx.post(
        f"http://{endpoint}/v3/kv/deleterange", json={"key": start, "range_end": end}, timeout=10
    )


PATTERN_STORE_KINDS = [kind for kind in STORE_KINDS if kind != "etcd"]
"""The stores the pattern and feature modules run on (the default ``store_kind``). etcd runs
the contract and the input domain on both faces (test_contract.py, test_domain.py), the state
machine and its own tests (test_etcd*.py), but not every module: durable tasks need a job
table etcd does not offer, and its network round trips would take the suite past its CI
budget."""


@pytest.fixture(params=PATTERN_STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[StoreMaker]:
    # Start PostgreSQL (etcd) only when a test actually runs on it.
    url = request.getfixturevalue("pg_url") if store_kind.endswith("postgresql") else None
    etcd = request.getfixturevalue("etcd_url") if store_kind.endswith("etcd") else None
    maker = StoreMaker(store_kind, tmp_path, url, etcd)
    yield maker
    maker.close()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def aio_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL for :func:`dibs.aio.open` on each store: a fresh place per test (a schema on
    PostgreSQL), for tests of the async stores themselves rather than their sync face."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dibs.db'}"
    else:
        url: str = request.getfixturevalue("pg_url")
        schema = f"t_{secrets.token_hex(6)}"
        yield schema_url(url, schema)
        drop_schema(url, schema)


CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
"""Headless Chromium that reaches nothing but the page under test."""


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, installed with apt-get when the machine has none."""
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=900
        )
    assert os.path.exists(path), "Debian's chromium did not install"
    return path


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Switch threads every microsecond so races really interleave (the GIL's 5 ms hides them)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(make_store: StoreMaker, clock: FakeClock) -> Store:
    return make_store(clock)


@pytest.fixture
def reopen(make_store: StoreMaker, clock: FakeClock) -> Callable[[], Store]:
    return lambda: make_store(clock)
