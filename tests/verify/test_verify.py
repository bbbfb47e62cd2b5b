"""dibs.verify: the checkers on hand-made histories, then real runs on memory:// and SQLite."""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from dibs import InvalidInput
from dibs.cli import main
from dibs.stores import store_class
from dibs.verify import Workload, check_history, read_history, run_workload
from dibs.verify._check import Report
from dibs.verify._history import LogRow, assemble
from dibs.verify._linear import INCONCLUSIVE, PartitionResult, check_partition
from dibs.verify._log import replay_log
from dibs.verify._runner import _errors_settle, _settle
from dibs.verify.harness import PostgresServer
from eventually import eventually
from pg_fixtures import schema_url

T0 = 1_800_000_000.0  # wall seconds; store times in results are µs


class Recorder:
    """Builds a history by hand: ``op(...)`` records one invocation and its completion."""

    def __init__(self, store: str = "memory://") -> None:
        # The runner records whether the store judged time on this machine's clock.
        local = store_class(store).local_clock
        self.events: list[dict[str, Any]] = [{"e": "run", "store": store, "local_clock": local}]
        self.n = 0

    def op(
        self,
        client: str,
        fn: str,
        args: dict[str, Any],
        start: float,
        end: float | None,
        status: str = "ok",
        **value: Any,
    ) -> str:
        """Record an op running from ``start`` to ``end`` (ms after T0); None: never completed."""
        self.n += 1
        op_id = f"{client}.{self.n}"
        self.events.append(
            {
                "e": "i",
                "id": op_id,
                "c": client,
                "f": fn,
                "a": args,
                "t": start,
                "w": T0 + start / 1000,
            }
        )
        if end is not None:
            self.events.append(
                {"e": status, "id": op_id, "v": value, "t": end, "w": T0 + end / 1000}
            )
        return op_id

    def grant(
        self,
        client: str,
        unit: str,
        start: float,
        end: float,
        cid: str,
        at: float,
        ttl: float | None = 0.1,
        status: str = "ok",
    ) -> None:
        """A claim of unit ``u/<unit>`` that was granted at ``at`` ms (store time)."""
        value: dict[str, Any] = {}
        if status == "ok":
            value = {
                "granted": True,
                "replayed": False,
                "taken": [],
                "claim_id": cid,
                "fence": int(cid),
                "state": "held" if ttl else "confirmed",
                "created_at": us(at),
                "updated_at": us(at),
                "expires_at": None if ttl is None else us(at + ttl * 1000),
            }
        self.op(client, "claim", claim_args(client, unit, ttl), start, end, status, **value)

    def check(self, **options: Any) -> Any:
        return check_history(assemble(self.events), **options)


def us(ms: float) -> int:
    return round((T0 + ms / 1000) * 1_000_000)


def claim_args(holder: str, unit: str, ttl: float | None = 0.1) -> dict[str, Any]:
    return {"res": "u", "targets": [["u", "u", unit]], "holder": holder, "rid": None, "ttl": ttl}


def on_claim(holder: str, cid: str, unit: str = "0") -> dict[str, Any]:
    return {
        "res": "u",
        "targets": [["u", "u", unit]],
        "holder": holder,
        "claim_id": cid,
        "fence": int(cid),
    }


# --- the linearizability checker -----------------------------------------------------------------


def test_sequential_claims_confirm_release_pass() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    h.op("a", "confirm", on_claim("a", "1"), 2, 3, state="confirmed")
    h.op(
        "b",
        "claim",
        claim_args("b", "0"),
        4,
        5,
        granted=False,
        replayed=False,
        taken=[["u", "u", "0"]],
    )
    h.op("a", "release", on_claim("a", "1"), 6, 7, released=True)
    h.grant("b", "0", 8, 9, "2", at=8.5)
    report = h.check()
    assert report.verdict == "ok", report.render()


def test_two_overlapping_grants_are_an_anomaly_with_both_in_the_witness() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 2, "1", at=1.0)
    h.grant("b", "0", 0.5, 3, "2", at=2.0)  # a's hold lives 100 ms
    report = h.check()
    assert report.verdict == "anomaly"
    (part,) = report.partitions
    assert sorted(op.client for op in part.witness) == ["a", "b"]
    assert "NOT LINEARIZABLE" in report.render()


def test_takeover_after_expiry_passes_but_not_before() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)  # expires at 10.5 ms
    h.grant("b", "0", 11, 12, "2", at=11.5)
    assert h.check().verdict == "ok"
    early = Recorder()
    early.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    early.grant("b", "0", 5, 6, "2", at=5.5)
    assert early.check().verdict == "anomaly"


def test_confirm_after_expiry_must_fail() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    h.op("a", "confirm", on_claim("a", "1"), 20, 21, "fail", error="HoldLost", reason="expired")
    assert h.check().verdict == "ok"
    bad = Recorder()
    bad.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    bad.op("a", "confirm", on_claim("a", "1"), 20, 21, state="confirmed")
    assert bad.check().verdict == "anomaly"


@pytest.mark.parametrize(("reason", "verdict"), [("taken_over", "ok"), ("expired", "anomaly")])
def test_a_dead_hold_whose_unit_was_claimed_answers_taken_over(reason: str, verdict: str) -> None:
    # The reason rule: whether or not a sweep marked it expired in between.
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)
    h.grant("b", "0", 11, 12, "2", at=11.5)
    h.op("a", "confirm", on_claim("a", "1"), 20, 21, "fail", error="HoldLost", reason=reason)
    assert h.check().verdict == verdict


def time_span(lo_ms: float, hi_ms: float) -> list[Any]:
    return ["t", "s", us(lo_ms), us(hi_ms)]


@pytest.mark.parametrize(("reason", "verdict"), [("taken_over", "ok"), ("expired", "anomaly")])
def test_a_kind_switch_takes_over_a_dead_span_hold(reason: str, verdict: str) -> None:
    h = Recorder()
    span_grant(h, "a", 0, 10, start=0, at=0.5, fence=1)  # a number span, dead at 1.5 ms
    args = {"res": "s", "targets": [time_span(0, 60_000)], "holder": "b", "rid": None, "ttl": 1}
    value = {
        "granted": True,
        "replayed": False,
        "taken": [],
        "claim_id": "2",
        "fence": 2,
        "state": "held",
        "created_at": us(5.5),
        "updated_at": us(5.5),
        "expires_at": us(1005.5),
    }
    h.op("b", "claim", args, 5, 6, **value)
    a_args = {
        "res": "s",
        "targets": [["n", "s", 0, 10]],
        "holder": "a",
        "claim_id": "1",
        "fence": 1,
    }
    h.op("a", "confirm", a_args, 20, 21, "fail", error="HoldLost", reason=reason)
    assert h.check().verdict == verdict


def test_a_kind_switch_over_a_live_span_is_refused() -> None:
    args = {"res": "s", "targets": [time_span(0, 60_000)], "holder": "b", "rid": None, "ttl": 1}
    refused = Recorder()
    span_grant(refused, "a", 0, 10, start=0, at=0.5, fence=1)
    refused.op("b", "claim", args, 0.6, 0.9, "fail", error="SpanKindMismatch")
    assert refused.check().verdict == "ok"
    granted = Recorder()
    span_grant(granted, "a", 0, 10, start=0, at=0.5, fence=1)
    value = {"granted": False, "replayed": False, "taken": [time_span(0, 60_000)]}
    granted.op("b", "claim", args, 0.6, 0.9, **value)
    assert granted.check().verdict == "anomaly"


def test_an_unknown_grant_may_or_may_not_have_happened() -> None:
    took_effect = Recorder()
    took_effect.grant("a", "0", 0, 1, "1", at=0.5, status="unknown")
    took_effect.op(
        "b",
        "claim",
        claim_args("b", "0"),
        2,
        3,
        granted=False,
        replayed=False,
        taken=[["u", "u", "0"]],
    )
    assert took_effect.check().verdict == "ok"
    did_not = Recorder()
    did_not.grant("a", "0", 0, 1, "1", at=0.5, status="unknown")
    did_not.grant("b", "0", 2, 3, "2", at=2.5)
    assert did_not.check().verdict == "ok"


def test_an_op_whose_client_died_has_no_completion_and_stays_unknown() -> None:
    h = Recorder()
    h.op("a", "claim", claim_args("a", "0"), 0, None)
    h.grant("b", "0", 2, 3, "2", at=2.5)
    report = h.check()
    assert report.verdict == "ok"
    assert report.unknown == 1


def test_a_store_time_outside_the_op_is_an_anomaly() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=5000.0)  # the store says "5 s later": a skewed clock
    assert h.check().verdict == "anomaly"


def test_wrong_fence_must_be_refused() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    args = {**on_claim("a", "1"), "fence": 2}
    h.op("a", "confirm", args, 2, 3, "fail", error="HoldLost", reason="fence")
    assert h.check().verdict == "ok"
    bad = Recorder()
    bad.grant("a", "0", 0, 1, "1", at=0.5)
    bad.op("a", "confirm", args, 2, 3, state="confirmed")
    assert bad.check().verdict == "anomaly"


def group_args(holder: str, units: list[str]) -> dict[str, Any]:
    targets = [["u", "u", unit] for unit in units]
    return {"res": "u", "targets": targets, "holder": holder, "rid": None, "ttl": 0.1}


def test_a_refusal_may_judge_targets_past_the_first_taken_one_without_waiting() -> None:
    # a holds u/1. b's grant of u/2 read the clock at 10 ms but committed after
    # 12 ms; c's group claim, refused on u/1, looked at u/2 in between and found
    # it free (PostgreSQL's refusal reads the targets after the first loss).
    def history(c_start: float) -> Recorder:
        h = Recorder()
        h.grant("a", "1", 0, 1, "1", at=0.5)
        h.grant("b", "2", 9, 20, "2", at=10.0)
        taken = [["u", "u", "1"]]
        c_end = c_start + 1
        value = {"granted": False, "replayed": False, "taken": taken}
        h.op("c", "claim", group_args("c", ["1", "2"]), c_start, c_end, **value)
        return h

    assert history(11).check().verdict == "ok"
    # After b's grant completed, u/2 was taken: a refusal naming only u/1 is wrong.
    assert history(21).check().verdict == "anomaly"


def span_grant(
    h: Recorder, client: str, lo: int, hi: int, start: float, at: float, fence: int
) -> None:
    args = {"res": "s", "targets": [["n", "s", lo, hi]], "holder": client, "rid": None}
    value = {
        "granted": True,
        "replayed": False,
        "taken": [],
        "claim_id": str(fence),
        "fence": fence,
        "state": "held",
        "created_at": us(at),
        "updated_at": us(at),
        "expires_at": us(at + 1),
    }
    h.op(client, "claim", {**args, "ttl": 0.001}, start, start + 3, **value)


def test_spans_that_do_not_overlap_need_not_take_fences_in_time_order() -> None:
    # a's span was dated first but drew the larger fence: fine when the spans
    # are apart, a fence that went back when they overlap.
    apart = Recorder()
    span_grant(apart, "a", 2, 5, start=0, at=1.0, fence=6)
    span_grant(apart, "b", 5, 6, start=0.5, at=2.5, fence=5)
    assert apart.check().verdict == "ok"
    overlapping = Recorder()
    span_grant(overlapping, "a", 2, 5, start=0, at=1.0, fence=6)
    span_grant(overlapping, "b", 4, 6, start=0.5, at=2.5, fence=5)  # a's hold ended at 2 ms
    assert overlapping.check().verdict == "anomaly"


def late_effect_history(**unknown: Any) -> Recorder:
    """On a server: a's claim ends in an error at 1 ms; b reads u/0 free at 5 ms, c sees a at 10."""
    h = Recorder("postgresql://db.example/app")
    h.op("a", "claim", claim_args("a", "0"), 0, 1, "unknown", **unknown)
    h.grant("d", "9", 20, 21, "7", at=20.5)  # pins the store clock's offset to ± 0.5 ms
    h.op("b", "holder_of", {"res": "u", "target": ["u", "u", "0"]}, 5, 6, holder=None)
    h.op("c", "holder_of", {"res": "u", "target": ["u", "u", "0"]}, 10, 11, holder="a")
    return h


def test_on_a_server_an_unknown_outcome_stays_open_until_settled() -> None:
    # Across a network a's claim may still commit after its client saw the error.
    assert late_effect_history(error="StoreUnavailable").check().verdict == "ok"
    # Over the loopback an error means the server was done with it: not after 1 ms.
    settled = late_effect_history(error="StoreUnavailable")
    settled.events[0]["errors_settle"] = True
    assert settled.check().verdict == "anomaly"
    # A killed client's op stays open, unless the runner saw its backends gone.
    assert late_effect_history(error="killed").check().verdict == "ok"
    assert late_effect_history(error="killed", settled=True).check().verdict == "anomaly"


@pytest.mark.parametrize(
    ("url", "settles"),
    [
        ("memory://", True),
        ("sqlite:////tmp/v.db", True),
        ("postgresql://app@127.0.0.1:5432/app?schema=v", True),
        ("postgresql://app@localhost/app", True),
        ("postgresql://app@[::1]/app", True),
        ("postgresql:///app?host=/var/run/postgresql", True),
        ("postgresql://app@db.internal/app", False),
        ("postgresql://app@10.0.0.5/app", False),
        ("postgresql:///app?host=db.internal", False),
    ],
)
def test_errors_settle_only_where_a_connection_breaks_by_the_servers_hand(
    url: str, settles: bool
) -> None:
    assert _errors_settle(Workload(url), store_class(url)) is settles


def test_a_search_past_its_budget_is_unknown_never_ok() -> None:
    h = Recorder()
    for i in range(300):
        h.op("a", "holder_of", {"res": "u", "target": ["u", "u", "0"]}, i, i + 0.5, holder=None)
    history = assemble(h.events)
    verdict = check_partition(
        history.ops, lambda op: (op.wall_start, op.wall_end), time.monotonic() - 1
    )
    assert verdict == INCONCLUSIVE
    report = check_history(history, budget=0.0)
    assert report.verdict in ("unknown", "ok")  # tiny parts may finish before the first check


# --- the log replay ------------------------------------------------------------------------------


def row(
    cid: str, state: str, created: float, expires: float | None, updated: float, **kw: Any
) -> LogRow:
    return LogRow(
        id=cid,
        fence=int(cid),
        holder=kw.get("holder", "a"),
        targets=(("u", "u", "0"),),
        state=state,
        created_at=us(created),
        expires_at=None if expires is None else us(expires),
        updated_at=us(updated),
        taken_over=kw.get("taken_over", False),
    )


def test_log_replay_finds_lost_confirmations_and_grants_over_live_claims() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    h.op("a", "confirm", on_claim("a", "1"), 2, 3, state="confirmed")
    ops = assemble(h.events).ops
    assert replay_log(ops, [row("1", "confirmed", 0.5, None, 2.5)]) == []
    lost = replay_log(ops, [row("1", "expired", 0.5, 100.5, 101)])
    assert [a.kind for a in lost] == ["lost-confirmation"]
    double = replay_log(
        ops, [row("1", "confirmed", 0.5, None, 2.5), row("2", "held", 50, 150, 50, holder="b")]
    )
    assert [a.kind for a in double] == ["grant-over-live-claim"]
    taken = replay_log(ops, [row("1", "confirmed", 0.5, None, 2.5, taken_over=True)])
    assert "confirm-after-takeover" in [a.kind for a in taken]


def test_log_replay_flags_a_grant_answered_without_its_claim() -> None:
    # A broken store (the PostgreSQL check-then-act plant) replayed a request whose
    # claim it had dropped: granted, but no claim. An anomaly, never a crash.
    h = Recorder()
    h.op("a", "claim", claim_args("a", "0"), 0, 1, granted=True, replayed=True, taken=[])
    lost = replay_log(assemble(h.events).ops, [])
    assert [a.kind for a in lost] == ["lost-grant"]


def test_log_replay_finds_a_claim_released_by_nobody() -> None:
    # A blind overwrite that marks a live hold released: no release asked for it.
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    ops = assemble(h.events).ops
    assert replay_log(ops, [row("1", "held", 0.5, 100.5, 0.5)]) == []
    nobody = replay_log(ops, [row("1", "released", 0.5, 100.5, 2)])
    assert [a.kind for a in nobody] == ["released-by-nobody"]
    h.op("a", "release", on_claim("a", "1"), 1.5, 2.5, released=True)
    assert replay_log(assemble(h.events).ops, [row("1", "released", 0.5, 100.5, 2)]) == []


def test_history_files_survive_a_torn_last_line(tmp_path: Path) -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in h.events) + '{"e": "i", "id"')
    history = read_history(path)
    assert len(history.ops) == 1


# --- real runs -----------------------------------------------------------------------------------


@pytest.mark.timeout(600)  # a fresh interpreter after each kill -9: slow on a loaded machine
def test_memory_store_passes_under_crashes_pauses_and_skew(tmp_path: Path) -> None:
    workload = Workload(
        "memory://", clients=4, ops=1500, faults=("kill", "pause", "skew"), fault_interval=0.2
    )
    report = check_history(read_history(run_workload(workload, tmp_path / "h.jsonl")))
    assert report.verdict == "ok", report.render()
    assert report.operations - report.kinds["sweep"] == 6000  # and the sweeper's
    assert min(report.kinds[k] for k in ("sweep", "get", "claims_of", "holder_of")) > 0
    assert report.faults.get("kill", 0) > 0 and report.faults.get("pause", 0) > 0
    assert report.log_anomalies == []


# A kill every 0.3 s, each respawning a client: 29 s in one loaded run of the suite, past
# the 120 s default in another (load 17 on 2 cores); test_verify_ci.py's runs get 600 s.
@pytest.mark.timeout(600)
def test_sqlite_store_passes_under_kill_9_pauses_and_skew(tmp_path: Path) -> None:
    workload = Workload(
        f"sqlite:///{tmp_path / 'v.db'}",
        clients=3,
        ops=1500,
        faults=("kill", "pause", "skew", "integrity"),
        fault_interval=0.3,
    )
    report = check_history(read_history(run_workload(workload, tmp_path / "h.jsonl")))
    assert report.verdict == "ok", report.render()
    assert report.operations - report.kinds["sweep"] == 4500
    assert report.faults.get("kill", 0) > 0
    assert report.faults.get("integrity_check", 0) == report.faults["kill"]
    assert report.log_anomalies == []


def test_cli_verify_then_check_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.jsonl"
    code = main(["verify", "--clients", "2", "--ops", "200", "--history", str(path), "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert (
        code == 0
        and figures["verdict"] == "ok"
        # The clients' 400 ops, beside whatever the sweeper did: on a fast run the clients
        # may finish before its first sweep, and then no "sweep" kind is listed at all.
        and figures["operations"] - figures["operation_kinds"].get("sweep", 0) == 400
    )
    assert main(["verify", "check", str(path)]) == 0
    assert "verdict: OK" in capsys.readouterr().out


def test_cli_exits_1_on_a_planted_bug(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["verify", "--clients", "4", "--ops", "300", "--plant", "check-then-act"]
    code = main([*argv, "--shrink", "1"])
    assert code == 1
    assert "NOT LINEARIZABLE" in capsys.readouterr().out


def test_cli_rejects_unknown_faults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--faults", "meteor"]) == 2
    assert "unknown fault" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "faults"),
    [
        ("memory://", "integrity"),
        ("memory://", "terminate"),
        ("sqlite:///x.db", "restart"),
        ("postgresql://u@h/d", "terminate"),  # without --admin-url
        ("postgresql://u@h/d", "restart"),  # the CLI cannot restart a server
    ],
)
def test_cli_rejects_faults_that_cannot_apply(
    url: str, faults: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", "--store", url, "--faults", faults]) == 2
    assert "fault" in capsys.readouterr().err


def test_a_long_offending_sub_history_prints_the_ops_on_the_impossible_ops_targets() -> None:
    # Shrinking ran out of time: of 130 ops, print those that share a lock with
    # the impossible op, up to it: the last 60 of them.
    h = Recorder()
    for i in range(100):
        unit = "1" if i % 4 == 0 else "0"
        h.op("a", "holder_of", {"res": "u", "target": ["u", "u", unit]}, i, i + 0.5, holder=None)
    for i in range(100, 130):
        h.op("a", "holder_of", {"res": "u", "target": ["u", "u", "0"]}, i, i + 0.5, holder=None)
    ops = assemble(h.events).ops
    bad = ops[99]  # on u/0, at 99 ms
    part = PartitionResult(
        "u", "anomaly", 130, 0.1, witness=ops, witness_note="as found", impossible=bad
    )
    report = Report(130, 130, 0, 0, [part], None, origin_us=us(0))
    text = report.render()
    assert (
        "(70 of its 130 ops not shown: the last 60 on the impossible op's targets follow)" in text
    )
    assert text.count("holder_of u/0") == 60 and "holder_of u/1" not in text
    assert "[   99.000 ..    99.500 ms] a holder_of u/0 -> ok holder=None   <== IMPOSSIBLE" in text
    assert "100.000 .." not in text


@pytest.mark.timeout(900)
def test_a_long_history_shrinks_to_the_two_contradicting_grants() -> None:
    # The budgets are a guard against a runaway search, not a speed test: on a loaded
    # machine a 5 s budget stopped the shrink early and the witness was not minimal.
    h = Recorder()
    for i in range(1500):
        h.op("r", "holder_of", {"res": "u", "target": ["u", "u", "0"]}, i, i + 0.5, holder=None)
    h.grant("a", "0", 2000, 2002, "1", at=2001.0)
    h.grant("b", "0", 2000.5, 2003, "2", at=2002.0)  # a's hold lives 100 ms
    report = h.check(budget=600.0, shrink_budget=600.0)
    (part,) = report.partitions
    assert part.verdict == "anomaly"
    assert sorted(op.client for op in part.witness) == ["a", "b"], report.render()


def test_settling_a_killed_client_ends_its_statements_on_the_server(
    pg_url: str, pg_admin_url: str
) -> None:
    # A statement of the dead client still running on the server is ended, and
    # settling waits until its backend is gone: nothing it sent can land later.
    name = "dibs-verify-test-c0.0"
    errors: list[BaseException] = []

    def dead_client() -> None:
        try:
            with psycopg.connect(pg_url, application_name=name) as conn:
                conn.execute("SELECT pg_sleep(30)")
        except psycopg.Error as exc:
            errors.append(exc)

    thread = threading.Thread(target=dead_client)
    thread.start()
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        eventually(lambda: admin.execute(query, (name,)).fetchone() == (1,), "the client is in")
    nemesis: list[dict[str, Any]] = []
    event = _settle(Workload(pg_url, admin_url=pg_admin_url), name, nemesis)
    thread.join()  # ended by the termination, not by its 30 s sleep: the error says which
    assert event is not None and event["terminated"] == 1 and nemesis == [event]
    assert errors and "terminating connection" in str(errors[0])


@pytest.mark.timeout(600)  # a PostgreSQL restart and respawned clients: slow on a loaded machine
def test_cli_restart_fault_runs_a_restart_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PostgresServer() as server:
        pg_ctl = [str(server.bindir / "pg_ctl"), "-D", str(server.datadir), "restart"]
        pg_ctl += ["-m", "fast", "-w", "-t", "120", "-l", str(server.logfile)]
        if server.os_user is not None:
            pg_ctl = ["runuser", "-u", server.os_user.pw_name, "--", *pg_ctl]
        command = f"cd {shlex.quote(str(server.root))} && LC_ALL=C {shlex.join(pg_ctl)}"
        url = schema_url(server.create_database(), "verify")
        # 300 ops a client outlast the first restart (after 4 fault rounds, 2 s) many times
        # over, since each kill respawns a client: 6 restarts in 14 s at a load of 12 on 2
        # cores, where 1,500 ops ran 64 restarts in 130 s to prove the same thing.
        argv = ["verify", "--store", url, "--clients", "2", "--ops", "300"]
        argv += ["--faults", "kill,restart", "--restart-command", command, "--json"]
        code = main(argv)
        figures = json.loads(capsys.readouterr().out)
        assert code == 0, figures
        assert figures["verdict"] == "ok" and figures["faults"]["restart"] >= 1
        # A command that fails is an error naming it, not a traceback.
        argv[argv.index(command)] = "exit 3"
        assert main(argv) == 1
        assert "restart command 'exit 3' exited with 3" in capsys.readouterr().err


def test_cli_restart_fault_needs_a_restart_command(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["verify", "--store", "postgresql://nowhere.invalid/db", "--faults", "restart"]
    assert main(argv) == 2
    assert "--restart-command" in capsys.readouterr().err


# --- second edition: fields, reads, sweeps, explanations -----------------------------------------


def confirmed(at: float, cid: str = "1", created: float = 0.5, **kw: Any) -> dict[str, Any]:
    """A confirm's result: the claim confirmed at ``at`` ms (store time)."""
    value = {"fence": int(cid), "state": "confirmed", "created_at": us(created)}
    value.update(updated_at=us(at), expires_at=None, holder="a")
    value.update(kw)
    return value


def test_a_second_confirm_shows_the_first_ones_updated_at() -> None:
    # The store never rewrites a confirmed claim: a second confirm (a retry
    # after a lost acknowledgement) returns the first one's updated_at.
    def history(second: float, **kw: Any) -> Recorder:
        h = Recorder()
        h.grant("a", "0", 0, 1, "1", at=0.5)
        h.op("a", "confirm", on_claim("a", "1"), 2, 3, **confirmed(2.5))
        h.op("a", "confirm", on_claim("a", "1"), 4, 5, **confirmed(second, **kw))
        return h

    assert history(2.5).check().verdict == "ok"
    assert history(4.5).check().verdict == "anomaly"  # restamped
    assert history(2.5, created_at=us(0.7)).check().verdict == "anomaly"  # creation moved
    assert history(2.5, fence=9).check().verdict == "anomaly"
    assert history(2.5, expires_at=us(99)).check().verdict == "anomaly"


def test_a_confirm_is_stamped_inside_its_own_window_while_the_hold_lives() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)  # expires at 10.5 ms
    h.op("a", "confirm", on_claim("a", "1"), 8, 12, **confirmed(11.0))  # after the expiry
    assert h.check().verdict == "anomaly"
    late = Recorder()
    late.grant("a", "0", 0, 1, "1", at=0.5)
    late.op("a", "confirm", on_claim("a", "1"), 2, 3, **confirmed(3.5))  # after it returned
    assert late.check().verdict == "anomaly"


def got(cid: str, state: str, created: float, expires: float | None, updated: float) -> Any:
    return {
        "found": True,
        "fence": int(cid),
        "state": state,
        "created_at": us(created),
        "updated_at": us(updated),
        "expires_at": None if expires is None else us(expires),
        "holder": "a",
    }


def get_args(cid: str) -> dict[str, Any]:
    return {"res": "u", "targets": [["u", "u", "0"]], "claim_id": cid}


@pytest.mark.parametrize(
    ("at", "state", "verdict"),
    [(2, "held", "ok"), (2, "expired", "anomaly"), (20, "expired", "ok"), (20, "held", "anomaly")],
)
def test_get_shows_the_state_the_model_allows_at_that_moment(
    at: float, state: str, verdict: str
) -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.01)  # expires at 10.5 ms
    h.op("b", "get", get_args("1"), at, at + 1, **got("1", state, 0.5, 10.5, 0.5))
    assert h.check().verdict == verdict


def test_get_of_a_claim_never_granted_finds_nothing() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    h.op("a", "release", on_claim("a", "1"), 2, 3, released=True)
    h.op("b", "get", get_args("1"), 4, 5, **got("1", "released", 0.5, None, 2.5))
    assert h.check().verdict == "ok"
    wrong = Recorder()
    wrong.grant("a", "0", 0, 1, "1", at=0.5)
    wrong.op("a", "release", on_claim("a", "1"), 2, 3, released=True)
    wrong.op("b", "get", get_args("1"), 4, 5, **got("1", "held", 0.5, 100.5, 0.5))
    assert wrong.check().verdict == "anomaly"


def listed(cid: str, state: str = "held", expires: float | None = 100.5) -> dict[str, Any]:
    shown = got(cid, state, 0.5, expires, 0.5)
    del shown["found"]
    return {"claim_id": cid, "targets": [["u", "u", "0"]], **shown}


@pytest.mark.parametrize(
    ("holder", "claims", "verdict"),
    [("a", ["1"], "ok"), ("a", [], "anomaly"), ("b", [], "ok"), ("b", ["1"], "anomaly")],
)
def test_claims_of_lists_exactly_the_holders_live_claims(
    holder: str, claims: list[str], verdict: str
) -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    shown = [{**listed(cid), "holder": holder} for cid in claims]
    h.op("c", "claims_of", {"res": "*", "holder": holder}, 2, 3, claims=shown)
    assert h.check().verdict == verdict


def test_claims_of_may_show_a_grant_nobody_learned_under_its_own_id() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, status="unknown")
    h.op("c", "claims_of", {"res": "*", "holder": "a"}, 2, 3, claims=[listed("7")])
    assert h.check().verdict == "ok"
    h.op("c", "claims_of", {"res": "*", "holder": "a"}, 4, 5, claims=[listed("7"), listed("8")])
    assert h.check().verdict == "anomaly"  # one unknown grant cannot be two claims


def test_sweeps_are_in_no_resources_history() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5, ttl=0.001)
    h.op("s", "sweep", {"res": "*"}, 5, 6, expired=1, purged_claims=0, purged_requests=0)
    h.op("a", "confirm", on_claim("a", "1"), 8, 9, "fail", error="HoldLost", reason="expired")
    report = h.check()
    assert report.verdict == "ok", report.render()
    assert [p.resource for p in report.partitions] == ["u"]
    assert report.kinds["sweep"] == 1 and report.races == 1


def test_an_anomaly_names_the_impossible_op_and_the_states_before_it() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    h.grant("b", "0", 2, 3, "2", at=2.5)  # a's hold lives 100 ms
    report = h.check()
    text = report.render()
    (bad,) = [line for line in text.splitlines() if "<== IMPOSSIBLE" in line]
    assert " b claim u/0 " in bad
    assert "the model's possible states just before it:" in text
    assert "claim 1 a u/0 held fence=1 expires 100.500ms" in text
    (item,) = report.to_json()["evidence"]
    assert item["kind"] == "not-linearizable" and item["resource"] == "u"
    assert sorted(item["ops"]) == ["a.1", "b.2"] and item["impossible"] == "b.2"
    assert any("fence=1" in line for state in item["states_before"] for line in state)
    assert report.to_json()["anomaly_kinds"] == {"not-linearizable": 1}


def test_log_anomalies_print_under_their_own_limit() -> None:
    h = Recorder()
    for i in range(8):
        h.grant("a", str(i), i * 10, i * 10 + 1, str(i + 1), at=i * 10 + 0.5)
        h.grant("b", str(i), i * 10 + 2, i * 10 + 3, str(i + 11), at=i * 10 + 2.5)
    history = assemble(h.events)
    unit = [("u", "u", str(i)) for i in range(8)]
    history.log = [
        LogRow(
            str(f), f, "ab"[f // 10], (unit[f % 10 - 1],), "held", us(f), us(f + 99), us(f), False
        )
        for f in [*range(1, 9), *range(11, 19)]
    ]
    report = check_history(history, max_witnesses=8, shrink_budget=1)
    text = report.render(limit=5, log_limit=3)
    # One resource, so one witness; the log anomalies print after it, under their own limit.
    assert text.count("NOT LINEARIZABLE") == 1 and text.count("<== IMPOSSIBLE") == 1
    assert report.log_anomalies is not None and len(report.log_anomalies) >= 8
    assert text.count("\nLOG: ") == 3 and "more log anomalies (--log-anomalies N)" in text
    no_witness = report.render(limit=0, log_limit=3)
    assert "<== IMPOSSIBLE" not in no_witness and no_witness.count("\nLOG: ") == 3


def test_the_summary_counts_faults_apart_from_bookkeeping() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    h.events[0].update(faults=["kill", "pause", "skew"], skew=5.0)
    for f in ("kill", "settle", "stop", "cont", "integrity_check"):
        h.events.append({"e": "nemesis", "f": f, "t": 0.5, "w": T0, "result": "ok"})
    text = h.check().render()
    assert "faults: kill 1, pause 1, skew ±5 s" in text
    assert "runner: paused clients resumed 1, store integrity checks 1" in text
    assert "search budget" not in text  # nothing ran out of time
    assert "store: memory://" in text


def test_pool_warnings_are_counted_not_printed_and_passwords_kept_out(
    pg_schema_url: str, pg_admin_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Cutting every connection makes each client's pool log warnings: they are
    # counted into the history, and stderr stays quiet.
    workload = Workload(
        pg_schema_url,
        clients=2,
        ops=400,
        faults=("terminate",),
        admin_url=pg_admin_url,
        fault_interval=0.05,
        sweep_interval=None,
    )
    history = read_history(run_workload(workload, tmp_path / "h.jsonl"))
    report = check_history(history)
    err = capfd.readouterr().err
    assert report.verdict == "ok", report.render()
    assert report.faults["terminate"] > 0
    (note,) = history.notes
    assert note["about"] == "psycopg" and note["count"] > 0, err
    assert "psycopg" not in err and "WARNING" not in err
    assert "logged by the clients" in report.render()
    password = urlsplit(pg_schema_url).password
    assert password and password not in (tmp_path / "h.jsonl").read_text()


def test_a_replayed_grant_without_its_claim_explains_no_state() -> None:
    # A broken store can answer a replay "granted" for a claim it dropped (the
    # PostgreSQL check-then-act control does): the model finds no state for it,
    # and the checker reports the history, rather than a KeyError on claim_id.
    from dibs.verify._model import State, _bind

    state = State({}, {}, {}, {})
    assert _bind(state, "?1", {"granted": True, "replayed": True, "fence": 3}) is None


def test_a_second_run_on_one_store_reads_only_its_own_log_rows(tmp_path: Path) -> None:
    """Before: the log replay read every claim in the store, so an earlier run's
    claims (or real ones) showed as "released-by-nobody" anomalies."""
    url = f"sqlite:///{tmp_path / 'twice.db'}"
    first = check_history(
        read_history(run_workload(Workload(url, clients=2, ops=150), tmp_path / "1.jsonl"))
    )
    assert first.verdict == "ok" and first.log_anomalies == [], first.render()
    second = check_history(
        read_history(run_workload(Workload(url, clients=2, ops=150), tmp_path / "2.jsonl"))
    )
    assert second.verdict == "ok", second.render()
    assert second.log_anomalies == [], second.render()
    assert second.log_rows > 0


@pytest.mark.parametrize(("ttl", "spread"), [(0.2, (0.02, 1.0)), (1.9, (1.0,)), (2.0, (0.5, 1.0))])
def test_holds_shorter_than_an_etcd_lease_are_refused_not_misjudged(
    ttl: float, spread: tuple[float, ...], tmp_path: Path
) -> None:
    """Before: run_workload on etcd with its default 0.2 s TTL reported anomalies: etcd
    keeps a hold 2 s at least, and an extend's expiry read as impossible."""
    workload = Workload("etcd://127.0.0.1:1", ttl=ttl, ttl_spread=spread)
    with pytest.raises(InvalidInput) as refused:
        run_workload(workload, tmp_path / "h.jsonl")
    assert refused.value.field == "ttl" and "at least" in str(refused.value)
