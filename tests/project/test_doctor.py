"""``dibs doctor URL``: each store's durability settings, judged against real servers.

PostgreSQL: a durable primary with two streaming standbys (dibs.verify.harness),
started once for the module, whose settings each test changes and puts back.
etcd: real members (dibs.verify.harness), one and three.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest

import dibs
from dibs.cli import main
from dibs.doctor import Finding, Severity, etcd_findings, examine, render_text
from dibs.verify.harness import (
    REPLICATION_SETTINGS,
    EtcdCluster,
    PostgresServer,
    ReplicatedCluster,
    free_ports,
)
from etcd_fixtures import cluster
from eventually import eventually
from layout import PLUGIN_DIR

pytestmark = pytest.mark.timeout(300)


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def _by_setting(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["setting"]: f for f in report["findings"]}


# --- PostgreSQL -------------------------------------------------------------------------------

CLEAN = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_standby_names": "ANY 1 (s1, s2)",
}


@pytest.fixture(scope="module")
def durable() -> Iterator[tuple[ReplicatedCluster, str]]:
    """A durable primary with standbys s1 and s2, synchronous ANY 1 of them."""
    with ReplicatedCluster(2, durable=True) as cluster:
        db = cluster.create_database()
        cluster.configure(cluster.primary, **CLEAN)
        yield cluster, cluster.url(db)


@pytest.fixture
def pg(durable: tuple[ReplicatedCluster, str]) -> Iterator[tuple[ReplicatedCluster, str]]:
    yield durable
    durable[0].configure(durable[0].primary, **CLEAN)  # put back what a test changed


def test_a_clean_postgresql_exits_zero(
    pg: tuple[ReplicatedCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _doctor(capsys, pg[1])
    assert code == 0, report
    assert not report["loses_data"]
    assert {f["severity"] for f in report["findings"]} == {"ok"}
    assert _by_setting(report)["synchronous_standby_names"]["value"] == "ANY 1 (s1, s2)"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("fsync", "off"),
        ("full_page_writes", "off"),
        ("synchronous_standby_names", ""),  # two standbys streaming asynchronously
    ],
)
def test_a_server_setting_that_can_lose_claims_exits_one(
    pg: tuple[ReplicatedCluster, str],
    capsys: pytest.CaptureFixture[str],
    setting: str,
    value: str,
) -> None:
    cluster, url = pg
    cluster.configure(cluster.primary, **{setting: value})
    code, report = _doctor(capsys, url)
    assert code == 1
    found = _by_setting(report)[setting]
    assert found["severity"] == "danger" and found["fix"]
    assert [f["setting"] for f in report["findings"] if f["severity"] == "danger"] == [setting]


@pytest.mark.parametrize("commit", ["off", "local", "remote_write"])
def test_synchronous_commit_as_the_urls_sessions_get_it(
    pg: tuple[ReplicatedCluster, str], capsys: pytest.CaptureFixture[str], commit: str
) -> None:
    url = pg[1] + f"&options=-c%20synchronous_commit%3D{commit}"
    code, report = _doctor(capsys, url)
    assert code == 1
    found = _by_setting(report)["synchronous_commit"]
    assert (found["severity"], found["value"]) == ("danger", commit)


def test_a_single_synchronous_standby_is_a_warning_not_a_loss(
    pg: tuple[ReplicatedCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, url = pg
    cluster.configure(cluster.primary, synchronous_standby_names="s1")
    code, report = _doctor(capsys, url)
    assert code == 0
    found = _by_setting(report)["synchronous_standby_names"]
    assert found["severity"] == "warning" and "ANY 1 (s1, s2)" in found["fix"]


def test_a_spare_that_is_not_streaming_is_no_spare(
    pg: tuple[ReplicatedCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # s1 and s2 stream, but only s1 is a candidate: losing s1 stops every write.
    cluster, _ = pg
    cluster.configure(cluster.primary, synchronous_standby_names="ANY 1 (s1, s3)")
    db = pg[1].rsplit("/", 1)[1].split("?")[0]
    code, report = _doctor(capsys, cluster.url(db, admin=True))  # sees sync_state
    assert code == 0
    found = _by_setting(report)["synchronous_standby_names"]
    assert found["severity"] == "warning", found
    # Two candidates named, none of them streaming: every commit waits now.
    cluster.configure(cluster.primary, synchronous_standby_names="ANY 1 (s3, s4)")
    code, report = _doctor(capsys, cluster.url(db, admin=True))
    found = _by_setting(report)["synchronous_standby_names"]
    assert found["severity"] == "warning" and "0 stream" in found["detail"], found


def test_a_logical_walsender_is_no_standby(capsys: pytest.CaptureFixture[str]) -> None:
    """A CDC reader (pg_recvlogical here) streams from the server, but no failover lands
    on it: no synchronous_standby_names is no loss then."""
    server = PostgresServer(settings={**REPLICATION_SETTINGS, "wal_level": "logical"}, durable=True)
    with server:
        url = server.create_database("cdc")  # the app role's URL
        with psycopg.connect(server.url("cdc"), autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')")
        reader = subprocess.Popen(
            [
                str(server.bindir / "pg_recvlogical"),
                "-d",
                server.url("cdc"),
                "--slot",
                "cdc",
                "--start",
                "-f",
                "/dev/null",
            ]
        )
        try:
            with psycopg.connect(server.admin_url, autocommit=True) as conn:
                eventually(
                    lambda: conn.execute(
                        "SELECT count(*) FROM pg_stat_replication r JOIN pg_replication_slots s "
                        "ON s.active_pid = r.pid"
                    ).fetchone()[0],
                    "the logical reader is streaming",
                )
            code, report = _doctor(capsys, url)
        finally:
            reader.terminate()
            reader.wait()
    assert code == 0, report
    assert "synchronous_standby_names" not in _by_setting(report)


def test_a_password_in_the_query_is_not_printed(
    pg: tuple[ReplicatedCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # libpq takes the password as a query parameter too; reports get pasted into tickets.
    parts = urlsplit(pg[1])
    password = parts.password
    assert password
    url = urlunsplit(
        parts._replace(
            netloc=parts.netloc.replace(f":{password}@", "@"),
            query=f"{parts.query}&password={password}",
        )
    )
    for args in (["--json"], []):
        assert main(["doctor", url, *args]) == 0
        out = capsys.readouterr().out
        assert "password=***" in out and password not in out


def test_a_standby_is_named_as_one(
    pg: tuple[ReplicatedCluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, url = pg
    standby_url = cluster.standbys[0].url(url.rsplit("/", 1)[1].split("?")[0])
    _, report = _doctor(capsys, standby_url)
    assert _by_setting(report)["pg_is_in_recovery()"]["severity"] == "warning"


def test_the_store_logs_the_findings_once_at_open(
    pg: tuple[ReplicatedCluster, str], caplog: pytest.LogCaptureFixture
) -> None:
    cluster, url = pg
    cluster.configure(cluster.primary, synchronous_standby_names="")
    with caplog.at_level(logging.WARNING, logger="dibs"):
        for schema in ("a", "b"):
            dibs.open(f"{url}&schema=w{schema}").close()
    lines = [r for r in caplog.records if r.name == "dibs.stores.postgres.durability"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.WARNING
    assert "synchronous_standby_names" in lines[0].getMessage()
    assert "ANY 1 (s1, s2)" in lines[0].getMessage()


def test_the_plain_report_names_each_fix(pg: tuple[ReplicatedCluster, str]) -> None:
    cluster, url = pg
    cluster.configure(cluster.primary, fsync="off")
    text = render_text(examine(url))
    assert "[DANGER] fsync = off" in text and "fix: set fsync = on" in text
    assert "password" not in text and cluster.primary.app_password not in text


# --- SQLite and memory ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "code"),
    [("", 1), ("?synchronous=normal", 1), ("?synchronous=off", 1), ("?synchronous=full", 0),
     ("?synchronous=extra", 0)],
)  # fmt: skip
def test_sqlite_synchronous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str, code: int
) -> None:
    path = tmp_path / "claims.db"
    dibs.open(f"sqlite:///{path}").close()
    got, report = _doctor(capsys, f"sqlite:///{path}{query}")
    assert got == code
    assert _by_setting(report)["journal_mode"] == {
        "severity": "ok",
        "setting": "journal_mode",
        "value": "wal",
        "detail": "write-ahead log, as dibs sets it",
        "fix": "",
    }


def test_sqlite_with_a_rollback_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()  # journal "delete"
    code, report = _doctor(capsys, f"sqlite:///{path}?synchronous=full")
    assert code == 0
    assert _by_setting(report)["journal_mode"]["severity"] == "warning"
    code, report = _doctor(capsys, f"sqlite:///{path}?synchronous=normal")
    assert code == 1 and "corrupt" in _by_setting(report)["synchronous"]["detail"]


def test_doctor_creates_no_sqlite_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", f"sqlite:///{tmp_path}/typo.db"]) == 2
    assert not (tmp_path / "typo.db").exists()
    assert "no SQLite store" in capsys.readouterr().err


def test_sqlite_urls_are_read_as_the_store_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A percent-encoded path names the file the store opens, not a missing one.
    path = tmp_path / "my claims?.db"
    dibs.open(f"sqlite:///{quote(str(path))}?synchronous=full").close()
    assert path.exists()
    code, report = _doctor(capsys, f"sqlite:///{quote(str(path))}?synchronous=full")
    assert code == 0, report
    # Options the store refuses are refused here too, never judged as the default.
    for query in ("?synchronous=fulll", "?synchronus=full"):
        assert main(["doctor", f"sqlite:///{quote(str(path))}{query}"]) == 2
        err = capsys.readouterr().err
        assert "synchronous" in err or "synchronus" in err


def test_memory_keeps_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _doctor(capsys, "memory://")
    assert code == 1 and "restart" in report["findings"][0]["detail"]
    assert main(["doctor", "memory://"]) == 1
    assert "DANGER" in capsys.readouterr().out


def test_an_unknown_scheme_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "mongodb://x"]) == 2
    assert "known schemes" in capsys.readouterr().err


# --- etcd -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd3() -> Iterator[EtcdCluster]:
    with cluster(3) as three:
        yield three


def test_a_healthy_three_member_etcd_is_clean(
    etcd3: EtcdCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _doctor(capsys, etcd3.url())
    assert code == 0, report
    assert [(f["setting"], f["severity"]) for f in report["findings"]] == [("members", "ok")]
    assert "survives 1 failed member" in report["findings"][0]["detail"]


def test_a_single_member_etcd_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    with cluster(1) as one:
        code, report = _doctor(capsys, one.url())
    assert code == 0
    assert _by_setting(report)["members"]["severity"] == "warning"


def test_an_unreachable_member_gives_the_quorum_margin(
    etcd3: EtcdCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    etcd3.kill(2)  # the last test on this cluster
    url = f"etcd://{etcd3.endpoints[2]},{etcd3.endpoints[0]}"  # a dead one first
    code, report = _doctor(capsys, url, "--timeout", "2")
    assert code == 0
    found = _by_setting(report)["reachable members"]
    assert found["value"] == "2/3"
    assert "quorum 2, so 0 more failure(s) stop writes" in found["detail"]


def test_etcd_rules_for_even_counts_and_lost_quorum() -> None:
    ok = {"leader": "1"}
    even = etcd_findings({"a": ok, "b": ok, "c": ok, "d": ok})
    assert [(f.setting, f.severity) for f in even] == [("members", Severity.WARNING)]
    lost = etcd_findings({"a": ok, "b": "refused", "c": "refused"})
    [margin] = [f for f in lost if f.setting == "reachable members"]
    assert "below the quorum of 2" in margin.detail
    split = etcd_findings({"a": {"leader": "1"}, "b": {"leader": "2"}, "c": ok})
    assert any(f.setting == "leader" for f in split)
    alarm = etcd_findings({"a": {**ok, "errors": ["NOSPACE"]}, "b": ok, "c": ok})
    assert any(f.value == "NOSPACE" for f in alarm)


def test_an_etcd_learner_is_no_voter() -> None:
    """A learner (etcdctl member add --learner) replicates but does not vote: three voters
    and a learner have a quorum of 2, and a learner not started yet costs no margin."""
    ok = {"leader": "1"}
    grown = etcd_findings({"a": ok, "b": ok, "c": ok, "l": ok}, learners={"l"})
    assert [(f.setting, f.severity) for f in grown] == [("members", Severity.OK)], grown
    assert "quorum 2" in grown[0].detail
    waiting = etcd_findings({"a": ok, "b": ok, "c": ok, "l": "no client URL"}, learners={"l"})
    [reach] = [f for f in waiting if f.setting == "reachable members"]
    assert "1 more failure(s) stop writes" in reach.detail, reach


def test_no_etcd_endpoint_answering_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    # 2, not 1: exit 1 says a setting can lose claims, and nothing was read.
    assert main(["doctor", f"etcd://127.0.0.1:{free_ports(1)[0]}", "--timeout", "1"]) == 2
    assert "StoreUnavailable" in capsys.readouterr().err


def test_an_unreachable_postgresql_is_not_reported_as_losing_data(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"postgresql://dibs@127.0.0.1:{free_ports(1)[0]},127.0.0.1:{free_ports(1)[0]}/x"
    assert main(["doctor", url, "--timeout", "1"]) == 2
    assert "StoreUnavailable" in capsys.readouterr().err


def test_a_plugin_store_answers_for_itself(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Doctor asks the store class (Store.durability): toy:// inherits the memory store's
    storage and so its answer; one that overrides durability() is reported as it says."""
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    code, report = _doctor(capsys, "toy://")
    assert code == 1
    assert [f["setting"] for f in report["findings"]] == ["store"]
    assert report["findings"][0]["severity"] == "danger"

    import toy_store

    mine = Finding(Severity.OK, "replicas", "3", "every write reaches 3 replicas")
    monkeypatch.setattr(
        toy_store.ToyStore, "durability", classmethod(lambda cls, url, *, timeout=5.0: [mine])
    )
    code, report = _doctor(capsys, "toy://")
    assert code == 0
    assert report["findings"] == [{**dataclasses.asdict(mine), "severity": "ok"}]


def test_a_plugin_store_that_does_not_know_is_named_and_not_judged(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    import toy_store

    monkeypatch.setattr(
        toy_store.ToyStore, "durability", classmethod(lambda cls, url, *, timeout=5.0: None)
    )
    code, report = _doctor(capsys, "toy://")
    assert code == 0
    [found] = report["findings"]
    assert found["severity"] == "warning" and "toy_store" in found["value"]


def test_without_a_url_it_reads_dibs_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DIBS_URL", "memory://")
    assert main(["doctor"]) == 1
    assert "memory://" in capsys.readouterr().out
