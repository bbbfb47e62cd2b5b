"""What only the PostgreSQL store has: URLs, schema, roles, the database clock, errors."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from typing import Any

import psycopg
import psycopg.errors
import pytest

import dibs
from dibs import InvalidInput, SchemaError, Span, StoreUnavailable, Unit
from dibs.stores.postgres import SCHEMA_VERSION, PostgresStore
from dibs.verify.harness import PostgresServer, free_ports
from eventually import eventually
from layout import SCRIPTS
from pg_fixtures import drop_schema, schema_url

pytestmark = pytest.mark.timeout(120)


def test_the_session_role_is_not_a_superuser(pg_url: str, pg_schema_url: str) -> None:
    # The contract suite runs as this role: dibs needs no superuser at run time.
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if not os.environ.get("DIBS_TEST_PG_URL"):
        assert row == (False,)
    with dibs.open(pg_schema_url) as store:
        assert store.claim(Unit("seat", "1"), holder="alice")


def test_url_options_are_dibs_or_libpq(pg_url: str) -> None:
    url = f"{pg_url}?schema=t_opts&pool_min=0&pool_max=3&pool_timeout=2.5&request_retention=60"
    try:
        with dibs.open(
            f"{url}&application_name=dibs-opts&options=-c%20statement_timeout%3D5000"
        ) as store:
            assert isinstance(store, PostgresStore)
            assert store.schema == "t_opts" and store.request_retention == 60
            with psycopg.connect(pg_url) as conn:
                assert store.claim(Unit("seat", "1"), holder="alice")
                rows = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dibs-opts'"
                ).fetchone()
                assert rows is not None and rows[0] >= 1
        # postgres:// is the same store; keyword options win over the URL.
        with dibs.open(url.replace("postgresql://", "postgres://"), request_retention=5) as again:
            assert again.request_retention == 5
            assert again.holder_of(Unit("seat", "1")) == "alice"
    finally:
        drop_schema(pg_url, "t_opts")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("schema=Bad-Name", "schema"),
        ("schema=1x", "schema"),
        ("pool_max=many", "pool_max"),
        ("pool_max=0", "pool_max"),
        ("pool_min=5&pool_max=2", "pool_min"),
        ("pool_timeout=0", "pool_timeout"),
        ("max_retries=-1", "max_retries"),
        ("request_retention=-3", "request_retention"),
    ],
)
def test_bad_url_options_are_invalid_input(pg_url: str, query: str, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        dibs.open(f"{pg_url}?{query}")
    assert raised.value.field == field


def test_schema_is_versioned_and_a_newer_one_is_refused(pg_url: str, pg_schema_url: str) -> None:
    schema = pg_schema_url.rsplit("schema=", 1)[1]
    dibs.open(pg_schema_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
        assert row.fetchone() == (str(SCHEMA_VERSION),)
        dibs.open(pg_schema_url).close()  # reopening an up-to-date schema changes nothing
        conn.execute(f"UPDATE {schema}.meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(SchemaError) as raised:
        dibs.open(pg_schema_url)
    assert raised.value.found == 999 and raised.value.supported == SCHEMA_VERSION


def _open_and_claim(url: str, n: int) -> bool:
    with dibs.open(url) as store:
        return bool(store.claim(Unit("first-use", str(n)), holder=f"p{n}"))


def test_many_processes_creating_the_schema_at_once_all_succeed(pg_url: str) -> None:
    schema = f"t_first_{os.getpid()}"
    try:
        with multiprocessing.get_context("spawn").Pool(4) as pool:
            assert pool.starmap(
                _open_and_claim, [(schema_url(pg_url, schema), n) for n in range(8)]
            )
    finally:
        drop_schema(pg_url, schema)


def test_a_role_without_create_gets_the_one_time_setup_explained(
    private_pg_server: PostgresServer,
) -> None:
    admin = private_pg_server.url("limited")
    with psycopg.connect(private_pg_server.admin_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE limited")
        conn.execute("CREATE ROLE dibs_limited LOGIN PASSWORD 'limited'")
    port = private_pg_server.port
    limited = f"postgresql://dibs_limited:limited@127.0.0.1:{port}/limited"
    # No CREATE on the database: neither the extension nor the schema can be made.
    with pytest.raises(SchemaError) as raised:
        dibs.open(limited)
    assert "CREATE EXTENSION btree_gist" in str(raised.value)
    # The one-time setup the docs give: the extension, and a schema the role owns.
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION btree_gist")
        conn.execute("CREATE SCHEMA dibs AUTHORIZATION dibs_limited")
    with dibs.open(limited) as store:
        assert store.claim([Unit("seat", "1"), Span("room", 0, 5)], holder="alice")


def test_btree_gist_is_created_by_a_database_owner(private_pg_server: PostgresServer) -> None:
    # btree_gist is a trusted extension: the owner of the database may create it.
    app_url = private_pg_server.create_database("owned", extension=False)
    with dibs.open(app_url) as store:
        assert store.claim(Span("room", 0, 5), holder="alice")


def test_an_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        dibs.open(f"postgresql://nobody:x@127.0.0.1:{free_ports(1)[0]}/db?pool_timeout=0.5")


def test_a_stopped_server_is_store_unavailable_until_it_returns(
    private_pg_server: PostgresServer,
) -> None:
    url = private_pg_server.create_database("bounce")
    with dibs.open(f"{url}?pool_timeout=0.5") as store:
        claim = store.claim(Unit("seat", "1"), holder="alice", request_id="r1").claim
        assert claim is not None
        private_pg_server.stop()
        for call in (
            lambda: store.claim(Unit("seat", "2"), holder="bob"),
            lambda: store.get(claim.id),
            lambda: store.confirm(claim.id, holder="alice", fence=claim.fence),
            store.sweep,
        ):
            with pytest.raises(StoreUnavailable) as raised:
                call()
            assert isinstance(raised.value, ConnectionError)
        private_pg_server.start()

        def replayed() -> Any:  # the pool reconnects in the background
            try:
                return store.claim(Unit("seat", "1"), holder="alice", request_id="r1")
            except StoreUnavailable:
                return None

        again = eventually(replayed, "the pool reconnects")
        assert again.replayed and again.claim == claim


def test_lock_wait_past_statement_timeout_is_store_unavailable(pg_schema_url: str) -> None:
    url = f"{pg_schema_url}&options=-c%20statement_timeout%3D300"
    with (
        dibs.open(url) as store,
        psycopg.connect(pg_schema_url.split("?", maxsplit=1)[0]) as blocker,
    ):
        schema = store.schema  # type: ignore[attr-defined]
        # An uncommitted insert of the same unit: our insert must wait for it.
        blocker.execute(
            f"INSERT INTO {schema}.units_v4 (resource, slot, id, state, fence, created_at, "
            "updated_at) VALUES ('seat', '1', 0, 'free', 0, now(), now())"
        )
        with pytest.raises(StoreUnavailable):
            store.claim(Unit("seat", "1"), holder="alice")
        blocker.rollback()
        assert store.claim(Unit("seat", "1"), holder="alice")


def test_holds_expire_on_the_database_clock(pg_schema_url: str) -> None:
    with dibs.open(pg_schema_url) as store:
        with psycopg.connect(pg_schema_url.split("?", maxsplit=1)[0]) as conn:
            stamp = "SELECT extract(epoch FROM clock_timestamp())"
            before, now, after = conn.execute(stamp), store.now(), conn.execute(stamp)
            bounds = (before.fetchone(), after.fetchone())
        assert bounds[0] is not None and bounds[1] is not None
        assert float(bounds[0][0]) <= now.timestamp() <= float(bounds[1][0])  # read in between
        claim = store.claim(Unit("seat", "1"), holder="alice", ttl=0.2).claim
        assert claim is not None and claim.expires_at is not None
        assert abs((claim.expires_at - claim.created_at).total_seconds() - 0.2) < 1e-6
        assert store.holder_of(Unit("seat", "1")) == "alice"
        expires_at = claim.expires_at
        # Real time on the database's clock, the point of the test: nothing to fake there.
        eventually(lambda: store.now() >= expires_at, "the database clock passed the expiry")
        assert store.holder_of(Unit("seat", "1")) is None
        assert store.claim(Unit("seat", "1"), holder="bob")


class _Flaky:
    """A stand-in pool whose connections fail ``failures`` times with ``error``."""

    def __init__(self, pool: Any, error: Exception, failures: int) -> None:
        self._pool = pool
        self._error = error
        self.failures = failures
        self.calls = 0
        self._lock = threading.Lock()  # guards failures and calls

    def getconn(self) -> Any:
        with self._lock:
            self.calls += 1
            fail = self.failures > 0
            self.failures -= 1
        if fail:
            raise self._error
        return self._pool.getconn()

    def putconn(self, conn: Any) -> None:
        self._pool.putconn(conn)

    def close(self) -> None:
        self._pool.close()


@pytest.mark.parametrize(
    "error", [psycopg.errors.SerializationFailure(), psycopg.errors.DeadlockDetected()]
)
def test_serialization_failures_and_deadlocks_are_retried(
    pg_schema_url: str, error: Exception
) -> None:
    with dibs.open(pg_schema_url, max_retries=3) as store:
        flaky = _Flaky(store._pool, error, failures=3)  # type: ignore[attr-defined]
        store._own_pool = flaky  # type: ignore[attr-defined]
        assert store.claim(Unit("seat", "1"), holder="alice")
        assert flaky.calls == 4
        flaky.failures = 4
        with pytest.raises(StoreUnavailable) as raised:
            store.claim(Unit("seat", "2"), holder="alice")
        assert isinstance(raised.value.__cause__, type(error))
        assert store.holder_of(Unit("seat", "2")) is None


def test_the_demo_audit_passes_on_postgres(pg_url: str) -> None:
    schema = f"t_demo_{os.getpid()}"
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from dibs.cli import main; sys.exit(main(sys.argv[1:]))",
                "demo",
                "--store",
                schema_url(pg_url, schema),
                "--customers",
                "800",
                "--processes",
                "2",
                "--no-progress",
                "--ttl",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=110,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Audit passed" in done.stdout
    finally:
        drop_schema(pg_url, schema)


def test_pg_ensure_finds_or_installs_a_server() -> None:
    script = str(SCRIPTS / "pg-ensure.sh")
    done = subprocess.run([script], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    bindir = done.stdout.strip().splitlines()[-1]
    assert os.access(os.path.join(bindir, "initdb"), os.X_OK)


def test_a_private_server_leaves_nothing_behind() -> None:
    with PostgresServer() as server:
        root, pid = server.root, server.pid()
        assert pid is not None and root.is_dir()
        with psycopg.connect(server.admin_url) as conn:
            row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'listen_addresses'")
            assert row.fetchone() == ("127.0.0.1",)
    assert not root.exists()
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie awaiting its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
