"""One parametrized ``store`` fixture runs every test against every store."""

from __future__ import annotations

import base64
import fcntl
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg_pool.base
import pytest

import dibs
import dibs.verify
from aio_face import open_face
from dibs import FakeClock, Store
from dibs.stores import store_class
from etcd_fixtures import (  # the session's etcd member (tests/support/etcd_fixtures.py)
    etcd_url,
    fresh_prefix,
)
from layout import SCRIPTS
from pg_fixtures import (  # PostgreSQL session fixtures (tests/support/pg_fixtures.py)
    drop_schema,
    pg_admin_url,
    pg_schema_url,
    pg_url,
    private_pg_server,
    schema_url,
)

# dibs.verify.harness installs nothing by itself; here it may run scripts/pg-ensure.sh,
# etcd-ensure.sh or cluster-ensure.sh when the machine lacks a server (apt-get, as root).
os.environ.setdefault("DIBS_HARNESS_ENSURE", str(SCRIPTS))

__all__ = ["etcd_url", "pg_admin_url", "pg_schema_url", "pg_url", "private_pg_server"]

STORE_KINDS = ["memory", "sqlite", "postgresql", "etcd"]
"""Every store the contract runs on."""

AIO_STORE_KINDS = ["aio-memory", "aio-sqlite", "aio-postgresql", "aio-etcd"]
"""The same stores through :func:`dibs.aio.open`, driven by tests/support/aio_face.py's sync face.
Only the modules that check the contract and the input domain ask for them (they override
``store_kind`` with :data:`ALL_STORE_KINDS`); the rest run on the sync stores only."""

ALL_STORE_KINDS = STORE_KINDS + AIO_STORE_KINDS

IN_PROCESS_KINDS = frozenset({"memory", "sqlite"})
"""The stores that need no server: the only backends ``quick`` runs on."""

SERVER_FIXTURES = {
    "postgresql": frozenset({"pg_url", "pg_admin_url", "pg_schema_url", "private_pg_server"}),
    "etcd": frozenset({"etcd_url"}),
}
"""Fixtures that start a backend's server: a test that asks for one runs on that backend."""

BACKEND_MARKERS = ("memory", "sqlite", "postgresql", "etcd")
"""One marker per store, applied by :func:`backends_of`: ``-m "not etcd"`` runs without etcd."""

MARKERS = {
    "quick": "the day-to-day subset: a module's tests that say QUICK = True, not slow, on "
    "memory:// and sqlite:// only (no server, nothing installed)",
    "memory": "runs on memory:// (applied from the store parametrization)",
    "sqlite": "runs on sqlite:// (applied from the store parametrization)",
    "postgresql": "runs on PostgreSQL: starts the session's private server",
    "etcd": "runs on etcd: starts the session's private member",
    "processes": "races or kills other processes (fork, spawn, kill -9): never quick",
}
"""The markers conftest applies by rule (``slow`` is declared in pyproject.toml)."""

FOLDERS = {
    "stores": "a test in tests/stores/: the claim contract, each store, migrations, plug-ins",
    "patterns": "a test in tests/patterns/: lots, match, booking, leases, @idempotent, observe",
    "tasks": "a test in tests/tasks/: in-process and durable tasks, the jobs CLI",
    "service": "a test in tests/service/: dibs serve, its wire, OpenAPI and pages",
    "verify": "a test in tests/verify/: dibs verify, clusters, faults, the server harness",
    "project": "a test in tests/project/: docs, packaging, layers, extras, the CLI's tools",
}
"""One marker per folder of the test tree, applied by :func:`folder_of`: ``-m service``."""
TESTS = Path(__file__).resolve().parent


def backends_of(item: pytest.Item) -> set[str]:
    """The stores a test runs on: its store parameters (``"aio-sqlite"`` counts as sqlite)
    and the server fixtures it asks for. Decided from the test alone, not from its file's
    name or folder, so the rule holds wherever the file lives."""
    found: set[str] = set()
    callspec = getattr(item, "callspec", None)
    for value in callspec.params.values() if callspec is not None else ():
        if isinstance(value, str) and value.removeprefix("aio-") in BACKEND_MARKERS:
            found.add(value.removeprefix("aio-"))
    names = set(getattr(item, "fixturenames", ()))
    for backend, fixtures in SERVER_FIXTURES.items():
        if names & fixtures:
            found.add(backend)
    found.update(m.name for m in item.iter_markers() if m.name in BACKEND_MARKERS)
    return found


def folder_of(item: pytest.Item) -> str | None:
    """The folder of the test tree a test lives in (``stores``, ``tasks``...), if any."""
    try:
        folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in FOLDERS else None


def is_quick(item: pytest.Item) -> bool:
    """``quick``: the module says ``QUICK = True``, the test is neither ``slow`` nor marked
    ``processes``, and it needs no server (memory://, sqlite:// or no store at all)."""
    module = getattr(item, "module", None)
    return (
        bool(getattr(module, "QUICK", False))
        and item.get_closest_marker("slow") is None
        and item.get_closest_marker("processes") is None
        and backends_of(item) <= IN_PROCESS_KINDS
    )


# psycopg_pool jitters each new connection's expiry with the global `random`, on its
# own threads and tasks. Hypothesis checks that nothing moves the global generator
# while it draws, and reports the pool's move as a strategy using `random`
# (HypothesisDeprecationWarning, an error here): a flaky failure of any Hypothesis
# test that runs beside a pool. In tests the pool gets a generator of its own.
psycopg_pool.base.random = random.Random().random  # type: ignore[attr-defined]


# dibs verify's checker bounds its search per resource (10 s) and its shrinking (10 s)
# by wall time, and answers "unknown" past them. Those are guards for a person at a
# terminal; on a loaded 2-core machine they are timing thresholds that turn an "ok" or a
# minimal witness into a flaky failure. The suite's checks get 10 minutes (a test that
# passes its own smaller budget keeps it); pytest-timeout still stops a runaway.
_check_defaults = dibs.verify.check_history.__kwdefaults__
assert _check_defaults is not None
_check_defaults.update(budget=600.0, shrink_budget=600.0)


def module_fixture_group(item: pytest.Item) -> str | None:
    """Under ``pytest -n`` (``--dist loadgroup``): the module's own name when the test uses a
    module-scoped fixture defined in its module (a server, a cluster, a built site), so one
    worker sets it up once instead of every worker that draws one of its tests."""
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        for fixturedef in defs:
            if fixturedef.scope == "module" and fixturedef.baseid == module:
                return module
    return None


def start_rank(item: pytest.Item) -> int:
    """Under ``pytest -n``, when a test goes out to a worker: 0, the long tests of a module
    that says ``RUN_EARLY = True``; 1, those that start processes or use a server, the
    seconds-long ones (``dibs verify`` runs, process races, the etcd and PostgreSQL
    variants); 2, the in-process rest, which fills the last minutes evenly. Within a rank
    the collection order stays (xdist sends the tests of an ``xdist_group`` first anyway)."""
    if getattr(getattr(item, "module", None), "RUN_EARLY", False):
        return 0
    if (
        folder_of(item) == "verify"
        or item.get_closest_marker("processes") is not None
        or backends_of(item) - IN_PROCESS_KINDS
    ):
        return 1
    return 2


def pytest_configure(config: pytest.Config) -> None:
    for name, text in {**MARKERS, **FOLDERS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist needs every worker to collect the same IDs: an ID with an object's address
    # ("<object object at 0x...>") differs per process and fails the whole run.
    unstable = [item.nodeid for item in items if " at 0x" in item.nodeid]
    if unstable:
        raise pytest.UsageError(f"test IDs that differ per process (give them ids=): {unstable}")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under -n the long tests go out first, so they overlap the many short ones instead
        # of running alone at the end: every worker stays busy to the last minute. Every
        # worker sorts alike (a stable sort), as xdist requires.
        items.sort(key=start_rank)
    for item in items:
        backends = backends_of(item)
        for backend in sorted(backends):
            item.add_marker(backend)
        if "etcd" in backends and item.get_closest_marker("timeout") is None:
            # Every etcd write waits for a raft fsync (about 25 ms, far more at a load of
            # 20+): the races that pass in 60 s at rest near the 120 s hang guard there.
            item.add_marker(pytest.mark.timeout(300))
        if folder := folder_of(item):
            item.add_marker(folder)
        if is_quick(item):
            item.add_marker(pytest.mark.quick)
        if item.get_closest_marker("xdist_group") is None and (group := module_fixture_group(item)):
            item.add_marker(pytest.mark.xdist_group(group))


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


PATTERN_STORE_KINDS = STORE_KINDS
"""The stores the pattern and feature modules run on (the default ``store_kind``): every
store. A module that needs a capability a store may lack selects its stores by that
capability (:func:`kinds_offering`), never by a list of names."""


def kinds_offering(capability: str, kinds: list[str] = STORE_KINDS) -> list[str]:
    """The store kinds whose store class offers ``capability`` (``"job_table"``,
    ``"change_feed"``, ``"claim_log"``): it overrides :class:`dibs.Store`'s method, whose
    default answer is ``None`` ("not supported"). Decided without opening a store, so
    collection needs no server."""
    base = getattr(dibs.Store, capability)
    return [
        kind
        for kind in kinds
        if getattr(store_class(f"{kind.removeprefix('aio-')}://"), capability) is not base
    ]


SHARED_STORE_KINDS = [kind for kind in STORE_KINDS if not store_class(f"{kind}://").in_process]
"""The stores other processes share (not ``in_process``): the tests with processes run there."""


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


def fresh_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """Yield a URL of a fresh place on store ``kind`` (a file, a PostgreSQL schema, an etcd
    key prefix), and remove it after the test; for fixtures that open stores by URL."""
    if kind == "memory":
        yield "memory://"
    elif kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'dibs.db'}"
    elif kind == "etcd":
        url: str = request.getfixturevalue("etcd_url")
        prefix = fresh_prefix()
        yield f"{url}/{prefix}"
        drop_etcd_prefix(url, prefix)
    else:
        url = request.getfixturevalue("pg_url")
        schema = f"t_{secrets.token_hex(6)}"
        yield schema_url(url, schema)
        drop_schema(url, schema)


@pytest.fixture(params=STORE_KINDS)
def aio_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL for :func:`dibs.aio.open` on each store: a fresh place per test (a schema on
    PostgreSQL, a key prefix on etcd), for tests of the async stores themselves rather than
    their sync face."""
    yield from fresh_url(request.param, tmp_path, request)


CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
"""Headless Chromium that reaches nothing but the page under test."""


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, installed with apt-get when the machine has none."""
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if os.path.exists(path):
        return path
    # Under pytest -n several workers may get here at once: one installs, the others
    # wait on the lock and find it installed (apt refuses a second apt anyway).
    lock = Path(tempfile.gettempdir()) / "dibs-apt.lock"  # scripts/*-ensure.sh take it too
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
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
