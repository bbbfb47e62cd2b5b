"""``dibs verify --cluster postgresql-ha``: a Patroni failover loses nothing; async loses claims.

The cluster runs are real: PostgreSQL 15 with two standbys under Patroni over a
3-member etcd, started from Debian's packages on loopback
(``scripts/cluster-ensure.sh`` installs them), the primary's member killed with
``kill -9`` mid-run while its standbys are held behind. A few seconds of
workload each (see DIST's CI budget). ``dibs doctor`` reads the same harness:
async exits 1, sync 0. The hold rule for stores whose holds may outlive their
TTL (etcd), the client-stamp rule (etcd's times are its clients'), and the
fence checks an asynchronous failover trips, are tested here on hand-built
histories.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_verify import Recorder, claim_args, on_claim, row, us

from dibs.cli import main
from dibs.verify import Workload, check_history, read_history
from dibs.verify._cluster_run import ClusterRun, outage, parse_cluster, run_on_cluster
from dibs.verify._history import assemble
from dibs.verify._log import acknowledged_fences, replay_log
from dibs.verify.harness import PostgresHA

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last

CLUSTER_TIMEOUT = 300


def outliving(h: Recorder) -> Recorder:
    """The history of a store whose holds may outlive their TTL (an etcd lease)."""
    h.events[0]["holds_outlive_ttl"] = True
    return h


def refused(h: Recorder, client: str, start: float, end: float) -> None:
    h.op(
        client,
        "claim",
        claim_args(client, "0"),
        start,
        end,
        granted=False,
        replayed=False,
        taken=[["u", "u", "0"]],
    )


# --- the hold rule: at least its TTL, maybe longer, never taken over early -----------------------


@pytest.mark.parametrize(("outlive", "verdict"), [(False, "anomaly"), (True, "ok")])
def test_a_hold_may_outlive_its_ttl_only_where_the_store_says_so(
    outlive: bool, verdict: str
) -> None:
    # a's hold expires at 10.5 ms, yet blocks b at 50 ms and is confirmed at 60 ms:
    # an etcd lease whose TTL restarted on a leader change.
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    refused(h, "b", 50, 51)
    h.op("a", "confirm", on_claim("a", "1"), 60, 61, state="confirmed", updated_at=us(60.5))
    assert (outliving(h) if outlive else h).check().verdict == verdict


def test_a_hold_that_may_outlive_its_ttl_is_still_never_taken_over_early() -> None:
    early = outliving(Recorder())
    early.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)  # lives at least until 10.5 ms
    early.grant("b", "0", 5, 6, "2", at=5.5)
    assert early.check().verdict == "anomaly"
    late = outliving(Recorder())
    late.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    late.grant("b", "0", 11, 12, "2", at=11.5)
    lost = {"error": "HoldLost", "reason": "taken_over"}
    late.op("a", "confirm", on_claim("a", "1"), 20, 21, "fail", **lost)
    assert late.check().verdict == "ok"
    seen_dead = outliving(Recorder())  # nor seen expired before its TTL
    seen_dead.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    expired = {"error": "HoldLost", "reason": "expired"}
    seen_dead.op("a", "confirm", on_claim("a", "1"), 5, 6, "fail", **expired)
    assert seen_dead.check().verdict == "anomaly"


def test_log_replay_of_outliving_holds_allows_late_confirms_not_early_grants() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    h.op("a", "confirm", on_claim("a", "1"), 60, 61, state="confirmed")
    ops = assemble(h.events).ops
    late = [row("1", "confirmed", 0.5, None, 60.5)]
    assert [a.kind for a in replay_log(ops, late)] == ["confirm-after-expiry"]
    assert replay_log(ops, late, outlive=True) == []
    over = [row("1", "confirmed", 0.5, None, 5), row("2", "held", 5, 105, 5, holder="b")]
    kinds = [a.kind for a in replay_log(ops, over, outlive=True)]
    assert kinds == ["grant-over-live-claim"]


# --- client stamps: etcd keeps no clock, so a stamp does not order the writes -------------------


def client_stamped(h: Recorder) -> Recorder:
    """The history of a store whose times are its clients' stamps, read before the write."""
    h.events[0]["client_stamps"] = True
    return h


def raced_release(b_start: float, b_end: float) -> Recorder:
    """b's grant is stamped at 9.5 ms, before a's release (stamped 11 ms), yet took a's unit."""
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=None)
    h.op("a", "release", on_claim("a", "1"), 10, 14, released=True)
    h.grant("b", "0", b_start, b_end, "2", at=9.5, ttl=None)
    rows = [row("1", "released", 0.5, None, 11), row("2", "confirmed", 9.5, None, 9.5, holder="b")]
    h.events += [r.to_json() for r in rows]
    return h


def test_a_client_stamp_orders_nothing_its_call_did_not() -> None:
    # The calls overlap: b's transaction may have reached the store after a's release.
    # On a store that stamps at the write (one clock, inside the lock) it is a double grant.
    assert raced_release(9, 15).check().verdict == "anomaly"
    assert client_stamped(raced_release(9, 15)).check().verdict == "ok"


def test_a_client_stamped_grant_answered_before_the_release_was_asked_is_an_anomaly() -> None:
    report = client_stamped(raced_release(5, 9.8)).check()
    assert report.verdict == "anomaly"
    kinds = report.to_json()["anomaly_kinds"]
    assert "grant-over-live-claim" in kinds
    assert any(p.verdict == "anomaly" for p in report.partitions)  # the search sees it too


def test_a_client_stamped_grant_left_unanswered_may_take_effect_any_time_later() -> None:
    # b's claim was stamped at 9.5 ms and never answered (its member was paused): its
    # transaction reached etcd after a's release, at 20-24 ms. No proof of a double grant.
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=None)
    h.op("a", "release", on_claim("a", "1"), 20, 24, released=True)
    h.op("b", "claim", claim_args("b", "0", None), 9, None)
    rows = [row("1", "released", 0.5, None, 21), row("2", "confirmed", 9.5, None, 9.5, holder="b")]
    h.events += [r.to_json() for r in rows]
    assert "grant-over-live-claim" in h.check().to_json()["anomaly_kinds"]  # by the stamps
    assert client_stamped(h).check().verdict == "ok"


# --- fences as the clients were told them --------------------------------------------------------


def test_a_fence_acknowledged_twice_and_a_fence_going_back_are_anomalies() -> None:
    # What an asynchronous failover does: the new primary's sequence is behind,
    # so it hands out a fence (and a claim ID) a client was already given.
    h = Recorder()
    h.grant("a", "0", 0, 1, "7", at=0.5, ttl=None)
    h.grant("b", "0", 10, 11, "5", at=10.5, ttl=None)  # after a failover: fence 5 < 7
    h.op(
        "c",
        "claim",
        claim_args("c", "1"),
        20,
        21,
        granted=True,
        replayed=False,
        taken=[],
        claim_id="5",
        fence=5,
        state="held",
        created_at=us(20.5),
        updated_at=us(20.5),
        expires_at=us(120.5),
    )
    ops = assemble(h.events).ops
    kinds = sorted(a.kind for a in acknowledged_fences(ops))
    assert kinds.count("fence-reissued") == 1 and kinds.count("fence-backwards") == 1
    report = h.check()
    assert report.verdict == "anomaly"
    assert {"fence-reissued", "fence-backwards"} <= set(report.to_json()["anomaly_kinds"])


def test_concurrent_grants_may_take_fences_in_either_order() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 10, "7", at=5, ttl=0.001)
    h.grant("b", "0", 1, 11, "5", at=2, ttl=0.001)  # overlapping in real time: no order
    assert acknowledged_fences(assemble(h.events).ops) == []


# --- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--cluster", "etcd:3", "--faults", "failover"],
        ["--cluster", "postgresql-ha", "--faults", "kill-leader"],
        ["--cluster", "etcd:0"],
        ["--cluster", "etcd:x"],
        ["--cluster", "cockroach"],
        ["--cluster", "etcd:3", "--replication", "async"],
        ["--replication", "async"],
        ["--cluster", "postgresql-ha", "--store", "sqlite:///x.db"],
        ["--cluster", "postgresql-ha", "--rounds", "2"],
    ],
)
def test_cli_rejects_a_cluster_option_that_cannot_apply(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", *argv]) == 2
    assert "error" in capsys.readouterr().err


def test_parse_cluster_names_the_bad_value() -> None:
    with pytest.raises(Exception, match="meteor"):
        parse_cluster("postgresql-ha", ("meteor",))


# --- the clusters --------------------------------------------------------------------------------


def run(tmp_path: Path, replication: str) -> tuple[Any, dict[str, float] | None]:
    cluster = ClusterRun(
        "postgresql-ha", faults=("failover",), replication=replication, warmup=2.0, after=2.0
    )
    workload = Workload("memory://", clients=4, ops=1_000_000, seed=17)
    path = run_on_cluster(cluster, workload, tmp_path / "h.jsonl")
    history = read_history(path)
    report = check_history(history, budget=60, shrink_budget=0, max_witnesses=0)
    acknowledged_while_behind(history)  # both standbys were held behind
    return report, outage(history)


@pytest.mark.timeout(CLUSTER_TIMEOUT)
def test_a_patroni_failover_with_synchronous_standbys_loses_nothing(tmp_path: Path) -> None:
    report, gap = run(tmp_path, "sync")
    print(f"\nsync failover: {report.to_json()['anomaly_kinds']}, write outage {gap}")
    assert report.verdict == "ok", report.render(limit=1, log_limit=5)
    assert report.faults.get("failover") == 1 and report.faults.get("promoted") == 1
    # The run spans the failover: writes were acknowledged by the new primary.
    assert gap is not None


def acknowledged_while_behind(history: Any) -> int:
    """Writes acknowledged while the standbys were held behind, before the primary died."""
    (behind,) = [e for e in history.nemesis if e["f"] == "standbys-behind"]
    (kill,) = [e for e in history.nemesis if e["f"] == "failover"]
    assert behind["receivers"] == 2  # both standbys' WAL receivers were stopped
    return sum(
        1
        for op in history.ops
        if op.fn in ("claim", "confirm", "extend", "release")
        and op.status == "ok"
        and behind["t"] <= op.end <= kill["t"]
    )


@pytest.mark.timeout(CLUSTER_TIMEOUT)
def test_an_async_failover_is_flagged_lost_claims_and_fences_given_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "h.jsonl"
    argv = ["verify", "--cluster", "postgresql-ha", "--replication", "async"]
    argv += ["--faults", "failover", "--after", "2", "--quiet", "--json", "--shrink", "0"]
    code = main([*argv, "--witnesses", "0", "--budget", "60", "--history", str(path)])
    figures = json.loads(capsys.readouterr().out)
    kinds = figures["anomaly_kinds"]
    print(f"\nasync failover: {figures['anomalies']} anomalies {kinds}, {figures['cluster']}")
    assert code == 1 and figures["verdict"] == "anomaly"
    assert kinds.get("lost-grant", 0) > 0
    assert kinds.get("fence-reissued", 0) > 0 or kinds.get("fence-backwards", 0) > 0
    assert figures["cluster"]["replication"] == "async"
    # The harness made the loss certain: the primary acknowledged writes nobody received.
    assert acknowledged_while_behind(read_history(path)) > 0


@pytest.mark.timeout(CLUSTER_TIMEOUT)
@pytest.mark.parametrize(("replication", "code"), [("async", 1), ("sync", 0)])
def test_dibs_doctor_flags_the_async_harness_and_passes_the_sync_one(
    replication: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # The harness dibs verify fails over, read as a user would: through its URL. Durable:
    # the verify runs turn fsync off (a killed process loses nothing), which doctor flags.
    with PostgresHA(replication=replication, durable=True) as pg:
        assert main(["doctor", pg.url(), "--json"]) == code
    report = json.loads(capsys.readouterr().out)
    found = {f["setting"]: f for f in report["findings"]}
    names = found["synchronous_standby_names"]
    print(f"\n{replication}: {names}")
    if replication == "async":
        assert names["severity"] == "danger" and "asynchronously" in names["detail"]
        assert "synchronous_standby_names" in names["fix"]
    else:
        # Patroni names one synchronous standby: no data at risk, only no spare.
        assert all(f["severity"] != "danger" for f in report["findings"]), report
        assert names["severity"] in ("ok", "warning")


@pytest.mark.parametrize("cluster", ["etcd:3", "postgresql-ha"])
def test_a_missing_package_is_a_setup_error_naming_it_not_a_verdict(
    cluster: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In a user's hands (no DIBS_HARNESS_ENSURE) nothing is installed: the error says how.
    monkeypatch.delenv("DIBS_HARNESS_ENSURE", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["verify", "--cluster", cluster, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "etcd-server" in err if cluster == "etcd:3" else "patroni" in err
    assert "cluster-ensure.sh" in err


def test_an_outliving_extend_counts_its_ttl_from_inside_the_op_not_from_its_write() -> None:
    def history(counted_from: float) -> Recorder:
        h = outliving(Recorder())
        h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
        extended = {"state": "held", "updated_at": us(4.5), "expires_at": us(counted_from + 10)}
        h.op("a", "extend", {**on_claim("a", "1"), "ttl": 0.01}, 3, 5, **extended)
        return h

    # The lease was granted at 3.5 ms, the write made at 4.5 ms: fine.
    assert history(3.5).check().verdict == "ok"
    # An expiry counted from before the op began is no lower bound of the hold's end.
    assert history(2.0).check().verdict == "anomaly"
