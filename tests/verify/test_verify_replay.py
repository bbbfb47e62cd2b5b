"""dibs verify's log replay on its own: what only the linearizability search used to catch.

A grant on other targets than asked, a stale fence accepted, an extend after
expiry, and a request ID replayed wrongly are each planted in a real store
(dibs.verify._planted_replay) and must be flagged by the replay alone: by
``replay_log`` called without the search, and by a check whose search has no
budget (as on a history too large to search). Clean runs on every store stay
clean under the same workload.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_verify import Recorder, claim_args, on_claim, row, us

from conftest import STORE_KINDS, drop_etcd_prefix
from dibs.verify import REPLAY_PLANTS, Workload, check_history, read_history, run_workload
from dibs.verify._history import History, assemble
from dibs.verify._log import replay_log
from etcd_fixtures import fresh_prefix
from pg_fixtures import drop_schema, schema_url

pytestmark = pytest.mark.timeout(300)

KIND = {
    "grant-targets": "grant-targets",
    "fence-ignored": "stale-fence-accepted",
    "extend-revives": "extend-after-expiry",
    "replay-reclaims": "replay-differs",
    "request-input-ignored": "request-input-ignored",
}
"""The replay anomaly each plant must produce."""

# Short holds and many transitions and retries: every planted bug gets its chance.
MIX = (
    ("claim", 44.0),
    ("retry", 10.0),
    ("transition", 60.0),
    ("holder_of", 4.0),
    ("get", 5.0),
    ("claims_of", 3.0),
)


def run(url: str, tmp_path: Path, plant: str | None = None, ops: int = 500) -> History:
    etcd = url.startswith("etcd://")  # leases of whole seconds, at least 2 (as the CLI sets)
    workload = Workload(
        url,
        clients=4,
        ops=ops,
        plant=plant,
        seed=1,
        ttl=2.0 if etcd else 0.2,
        ttl_spread=(1.0, 2.0) if etcd else (0.005, 0.01, 0.5, 1.0),
        mix=MIX,
        # Without a sweeper a dead hold stays "held" until taken over: extend-revives's chance.
        sweep_interval=None if plant else 0.05,
    )
    return read_history(run_workload(workload, tmp_path / "h.jsonl"))


def replay_kinds(history: History) -> set[str]:
    assert history.log is not None
    return {a.kind for a in replay_log(history.ops, history.log)}


# --- each check on a hand-made history -----------------------------------------------------------


def group_grant(h: Recorder, units: list[str], cid: str = "1") -> None:
    args = claim_args("a", units[0])
    args["targets"] = [["u", "u", u] for u in units]
    value = {"granted": True, "replayed": False, "taken": [], "claim_id": cid, "fence": int(cid)}
    value.update(state="held", created_at=us(0.5), updated_at=us(0.5), expires_at=us(100.5))
    h.op("a", "claim", args, 0, 1, **value)


def test_a_grant_on_other_targets_than_asked() -> None:
    h = Recorder()
    group_grant(h, ["0", "1"])
    ops = assemble(h.events).ops
    both = row("1", "held", 0.5, 100.5, 0.5)
    both = dataclasses.replace(both, targets=(("u", "u", "1"), ("u", "u", "0")))
    assert replay_log(ops, [both]) == []  # order is no matter
    lost = replay_log(ops, [row("1", "held", 0.5, 100.5, 0.5)])
    assert [a.kind for a in lost] == ["grant-targets"]
    assert "u/0+u/1" in lost[0].message


@pytest.mark.parametrize("fn", ["confirm", "extend", "release"])
def test_a_stale_fence_acknowledged(fn: str) -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    args = on_claim("a", "1")
    value: dict[str, Any] = {"released": True} if fn == "release" else {"state": "held"}
    if fn == "extend":
        args["ttl"] = 0.1
        value["expires_at"] = us(102.5)
    elif fn == "confirm":
        value = {"state": "confirmed"}
    state = {"confirm": "confirmed", "extend": "held", "release": "released"}[fn]
    log = [row("1", state, 0.5, 102.5 if fn == "extend" else 100.5, 2.5)]
    h.op("a", fn, args, 2, 3, **value)
    assert replay_log(assemble(h.events).ops, log) == []
    h.op("a", fn, {**args, "fence": 2}, 4, 5, **value)
    assert [a.kind for a in replay_log(assemble(h.events).ops, log)] == ["stale-fence-accepted"]


def extend(h: Recorder, start: float, decided: float, ttl: float = 0.1, **kw: Any) -> None:
    args = {**on_claim("a", "1"), "ttl": ttl}
    value = {"state": "held", "expires_at": us(decided + ttl * 1000), **kw}
    h.op("a", "extend", args, start, start + 1, **value)


def test_an_extend_after_expiry_acknowledged() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)  # expires at 100.5 ms
    extend(h, 50, decided=50.5)  # expires at 150.5 ms
    extend(h, 140, decided=140.5)  # live: after the grant's expiry, before the extension's
    log = [row("1", "held", 0.5, 240.5, 140.5)]
    assert replay_log(assemble(h.events).ops, log) == []
    extend(h, 300, decided=300.5)  # dead since 240.5 ms
    late = replay_log(assemble(h.events).ops, [row("1", "held", 0.5, 400.5, 300.5)])
    assert [a.kind for a in late] == ["extend-after-expiry"]
    # Where holds may outlive their expiry (etcd's leases), it is no anomaly.
    assert (
        replay_log(assemble(h.events).ops, [row("1", "held", 0.5, 400.5, 300.5)], outlive=True)
        == []
    )


def test_an_unacknowledged_extend_leaves_the_expiry_unbounded() -> None:
    h = Recorder()
    h.grant("a", "0", 0, 1, "1", at=0.5)
    h.op("a", "extend", {**on_claim("a", "1"), "ttl": 0.2}, 50, None)  # may have landed
    extend(h, 200, decided=200.5)
    assert replay_log(assemble(h.events).ops, [row("1", "held", 0.5, 300.5, 200.5)]) == []


def request(h: Recorder, start: float, rid: str = "r1", ttl: float | None = 0.1, **v: Any) -> None:
    h.op("a", "claim", {**claim_args("a", "0", ttl), "rid": rid}, start, start + 1, **v)


GRANT = {"granted": True, "taken": [], "claim_id": "1", "fence": 1, "state": "held"}
GRANT |= {"created_at": us(0.5), "updated_at": us(0.5), "expires_at": us(100.5)}
REFUSED = {"granted": False, "taken": [["u", "u", "0"]]}


def test_a_request_replays_its_first_outcome() -> None:
    h = Recorder()
    request(h, 0, **GRANT, replayed=False)
    request(h, 10, **GRANT, replayed=True)
    request(h, 20, rid="r2", **REFUSED, replayed=False)
    request(h, 30, rid="r2", **REFUSED, replayed=True)
    log = [row("1", "held", 0.5, 100.5, 0.5)]
    assert replay_log(assemble(h.events).ops, log) == []
    # A refusal answered afresh (the same answer, but the request was forgotten) ...
    again = Recorder()
    again.events = [*h.events]
    request(again, 40, rid="r2", **REFUSED, replayed=False)
    assert [a.kind for a in replay_log(assemble(again.events).ops, log)] == ["replay-differs"]
    # ... or answered otherwise.
    other = Recorder()
    other.events = [*h.events]
    request(other, 40, rid="r2", **{**GRANT, "claim_id": "2", "fence": 2}, replayed=False)
    log2 = [*log, row("2", "held", 0.5, 100.5, 0.5, holder="a")]
    kinds = [a.kind for a in replay_log(assemble(other.events).ops, log2)]
    assert "replay-differs" in kinds


def test_a_request_id_answered_for_two_inputs() -> None:
    h = Recorder()
    request(h, 0, **GRANT, replayed=False)
    h.op("a", "claim", {**claim_args("a", "0", 7.0), "rid": "r1"}, 10, 11, "fail")
    log = [row("1", "held", 0.5, 100.5, 0.5)]
    assert replay_log(assemble(h.events).ops, log) == []  # a RequestConflict: right
    request(h, 20, ttl=7.0, **GRANT, replayed=True)
    kinds = [a.kind for a in replay_log(assemble(h.events).ops, log)]
    assert kinds == ["request-input-ignored"]


# --- planted bugs, caught by the replay alone ----------------------------------------------------


def plant_url(kind: str, tmp_path: Path) -> str:
    return "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'p.db'}"


@pytest.mark.parametrize("plant", REPLAY_PLANTS)
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_replay_alone_catches_each_plant(plant: str, kind: str, tmp_path: Path) -> None:
    # memory:// is fast: more ops for an extend to meet a dead hold nobody took over.
    history = run(plant_url(kind, tmp_path), tmp_path, plant, ops=2000 if kind == "memory" else 500)
    assert KIND[plant] in replay_kinds(history)
    # With no time to search (a history too large), the check still says anomaly.
    report = check_history(history, budget=0.0, max_witnesses=0)
    assert report.verdict == "anomaly", report.render()
    assert KIND[plant] in {a.kind for a in report.log_anomalies or []}


@pytest.fixture(params=STORE_KINDS)
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh place on each store: a file, a schema, a key prefix."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dibs.db'}"
    elif request.param == "etcd":
        url: str = request.getfixturevalue("etcd_url")
        prefix = fresh_prefix()
        yield f"{url}/{prefix}"
        drop_etcd_prefix(url, prefix)
    else:
        url = request.getfixturevalue("pg_url")
        schema = f"t_{secrets.token_hex(6)}"
        yield schema_url(url, schema)
        drop_schema(url, schema)


def test_clean_runs_stay_clean(any_url: str, tmp_path: Path) -> None:
    history = run(any_url, tmp_path, ops=300)
    report = check_history(history, max_witnesses=1, shrink_budget=3.0)
    assert report.log_anomalies == [], report.render()
    assert report.verdict == "ok", report.render()
    kinds = report.kinds
    # The workload exercised what the replay checks: groups, retries, stale fences, extends.
    assert kinds.get("extend", 0) > 10 and kinds.get("confirm", 0) > 10, kinds
    assert sum(1 for op in history.ops if op.args.get("rid") and op.value.get("replayed")) > 0
