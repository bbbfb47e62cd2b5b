"""The one migration runner: numbered steps, functions from their current file, no downgrades.

Every schema dibs owns is upgraded here from every earlier version, populated:
SQLite's claim tables (version 1) and job tables (unversioned, "0"), and
PostgreSQL's job tables (unversioned). PostgreSQL's claim schema versions 1
and 2 are upgraded in tests/test_postgres_edges.py, version 3 (populated, to
version 4) in tests/test_postgres_upgrade.py. The earlier versions' SQL
is frozen in tests/schemas, so that editing a shipped step cannot quietly
change what "an earlier version" means here.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import psycopg
import pytest

import dibs
from dibs import SchemaError, Unit
from dibs.stores._migrate import Migrations
from dibs.stores.jobs import Job
from dibs.stores.sqlite import SQLiteStore

SCHEMAS = Path(__file__).parent / "schemas"
JOB = Job(id="j1", name="send", args="[[], {}]", run_at=0.0, attempt=1, max_attempts=3,
          state="pending")  # fmt: skip


# --- the runner ---------------------------------------------------------------------------------


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> Migrations:
    name = f"fake_sql_{len(sys.modules)}"
    root = tmp_path / name
    for path, text in {"__init__.py": "", **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return Migrations(name, "demo")


STEPS = {
    "sql/demo/0001_tables.sql": "CREATE TABLE t (a);",
    "sql/demo/0002_functions_only.sql": "-- only the function changed",
    "sql/demo/0003_column.sql": "ALTER TABLE t ADD b;",
    "sql/demo/functions/f.sql": "FUNCTION f v3",
    "sql/demo/functions/g.sql": "FUNCTION g v3",
}


@pytest.mark.parametrize(
    ("found", "ran"),
    [
        (0, ["CREATE TABLE t (a);", "ALTER TABLE t ADD b;", "FUNCTION f v3", "FUNCTION g v3"]),
        (1, ["ALTER TABLE t ADD b;", "FUNCTION f v3", "FUNCTION g v3"]),
        (2, ["ALTER TABLE t ADD b;", "FUNCTION f v3", "FUNCTION g v3"]),
        (3, []),
    ],
)
def test_missing_steps_run_in_order_then_every_function_is_recreated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: int, ran: list[str]
) -> None:
    migrations = _package(tmp_path, monkeypatch, STEPS)
    assert migrations.version == 3
    scripts: list[str] = []
    assert migrations.upgrade(found, scripts.append, "db") is bool(ran)
    assert scripts == ran


def test_a_newer_schema_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    migrations = _package(tmp_path, monkeypatch, STEPS)
    with pytest.raises(SchemaError) as raised:
        migrations.upgrade(4, [].append, "'x.db'")
    assert (raised.value.found, raised.value.supported) == (4, 3)
    assert "'x.db' has dibs demo schema version 4" in str(raised.value)


def test_steps_must_be_numbered_without_gaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrations = _package(tmp_path, monkeypatch, {"sql/demo/0002_b.sql": "SELECT 1;"})
    with pytest.raises(AssertionError, match=r"1\.\.n"):
        _ = migrations.version


def test_the_shipped_schemas_are_package_data() -> None:
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert '"stores/*/sql/**/*.sql"' in pyproject
    for package in ("dibs.stores.sqlite", "dibs.stores.postgres"):
        for name in ("claims", "jobs"):
            assert Migrations(package, name).version >= 1


# --- SQLite -------------------------------------------------------------------------------------


def _sqlite_file(path: Path, *frozen: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for name in frozen:
        conn.executescript((SCHEMAS / name).read_text())
    return conn


def test_a_populated_version_1_sqlite_file_opens_with_its_claims(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = _sqlite_file(path, "sqlite_claims_v1.sql")
    conn.execute("INSERT INTO dibs_meta (key, value) VALUES ('schema_version', '1')")
    conn.execute(
        "INSERT INTO dibs_claims (fence, holder, targets, state, created_at, updated_at) "
        """VALUES (7, 'alice', '[["u","seat","1"]]', 'confirmed', 1, 1)"""
    )
    conn.execute("INSERT INTO dibs_units (resource, slot, fence) VALUES ('seat', '1', 7)")
    conn.close()
    with dibs.open(f"sqlite:///{path}") as store:
        assert store.holder_of(Unit("seat", "1")) == "alice"
        assert not store.claim(Unit("seat", "1"), holder="bob")
        granted = store.claim(Unit("seat", "2"), holder="bob").claim
        assert granted is not None and granted.fence > 7


def test_unversioned_sqlite_job_tables_are_upgraded_with_their_rows(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    SQLiteStore(path).close()
    conn = _sqlite_file(path, "sqlite_jobs_v0.sql")
    conn.execute(
        "INSERT INTO dibs_jobs (id, name, args, run_at, attempt, max_attempts, state, retries, "
        "failures) VALUES ('j1', 'send', '[[], {}]', 0, 1, 3, 'pending', 0, 0)"
    )
    conn.close()
    with SQLiteStore(path) as store:
        jobs = store.job_table()
        assert jobs.get("j1") == JOB
    conn = sqlite3.connect(path)
    row = conn.execute("SELECT value FROM dibs_meta WHERE key = 'jobs_schema_version'").fetchone()
    assert row == ("1",)
    conn.execute("UPDATE dibs_meta SET value = '9' WHERE key = 'jobs_schema_version'")
    conn.commit()
    conn.close()
    with SQLiteStore(path) as store, pytest.raises(SchemaError) as raised:
        store.job_table()
    assert (raised.value.found, raised.value.supported) == (9, 1)


# --- PostgreSQL ---------------------------------------------------------------------------------


def test_unversioned_postgres_job_tables_are_upgraded_with_their_rows(
    pg_url: str, pg_schema_url: str
) -> None:
    schema = pg_schema_url.rsplit("schema=", 1)[1]
    dibs.open(pg_schema_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute((SCHEMAS / "postgres_jobs_v0.sql").read_text().replace("{s}", schema).encode())
        conn.execute(
            f"INSERT INTO {schema}.jobs (id, name, args, run_at, attempt, max_attempts, state, "
            "retries, failures) VALUES ('j1', 'send', '[[], {}]', 0, 1, 3, 'pending', 0, 0)"
        )
    with dibs.open(pg_schema_url) as store:
        jobs = store.job_table()
        assert jobs is not None and jobs.get("j1") == JOB
    with psycopg.connect(pg_url, autocommit=True) as conn:
        query = f"SELECT value FROM {schema}.meta WHERE key = 'jobs_schema_version'"
        assert conn.execute(query).fetchone() == ("1",)
        conn.execute(f"UPDATE {schema}.meta SET value = '9' WHERE key = 'jobs_schema_version'")
    with dibs.open(pg_schema_url) as store, pytest.raises(SchemaError) as raised:
        store.job_table()
    assert (raised.value.found, raised.value.supported) == (9, 1)
