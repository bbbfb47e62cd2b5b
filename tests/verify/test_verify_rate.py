"""dibs verify checks rate limits: their decisions are in the history, an over-admission is flagged.

Hand-made histories pin the rule (no window of the rate's length holds more
than its limit, on acknowledged admissions); real runs with the
``rate-over-limit`` plant (a RateLimit with one slot too many) must be flagged
on every run and every store, and the same runs without it must pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_verify import Recorder, us

from dibs.cli import main
from dibs.verify import Workload, check_history, read_history, run_workload
from pg_fixtures import schema_url

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last


def rate(
    rec: Recorder, start: float, end: float, at: float | None, cost: int = 1, **v: Any
) -> None:
    """A ``rate`` op of key ``r`` at 2/100ms, admitted at ``at`` ms (None: refused)."""
    value: dict[str, Any] = {"allowed": at is not None, "retry_after": 0.0 if at else 0.05}
    if at is not None:
        value.update(created_at=us(at), expires_at=us(at + 100))
    value.update(v)
    args = {"res": "r", "rate": "2/100ms", "cost": cost}
    rec.op("c0", "rate", args, start, end, **value)


def test_admissions_within_the_limit_pass() -> None:
    rec = Recorder()
    rate(rec, 0, 1, 0.5)
    rate(rec, 1, 2, 1.5)
    rate(rec, 2, 3, None)
    rate(rec, 100, 101, 100.5)  # the first one's window has ended: [0.5, 100.5)
    report = rec.check()
    assert report.verdict == "ok", report.render()
    assert report.kinds["rate"] == 4


def test_one_unit_too_many_in_a_window_is_an_anomaly() -> None:
    rec = Recorder()
    rate(rec, 0, 1, 0.5)
    rate(rec, 50, 51, 50.5, cost=2)
    report = rec.check()
    assert report.verdict == "anomaly"
    [evidence] = report.evidence()
    assert evidence["kind"] == "rate-limit"
    assert "admitted 3 units" in evidence["message"] and "allows 2" in evidence["message"]


def test_an_admission_whose_outcome_is_unknown_is_not_counted() -> None:
    rec = Recorder()
    rate(rec, 0, 1, 0.5, cost=2)
    rec.op("c1", "rate", {"res": "r", "rate": "2/100ms", "cost": 1}, 2, None)  # never answered
    assert rec.check().verdict == "ok"


def _run(url: str, plant: str | None, seed: int, tmp_path: Path, clients: int = 4) -> Any:
    workload = Workload(url, clients=clients, ops=500, plant=plant, seed=seed)
    return check_history(read_history(run_workload(workload, tmp_path / f"h{seed}.jsonl")))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_memory_rate_plant_is_caught_on_every_run(seed: int, tmp_path: Path) -> None:
    report = _run("memory://", "rate-over-limit", seed, tmp_path)
    assert report.verdict == "anomaly", report.render()
    assert {e["kind"] for e in report.evidence()} == {"rate-limit"}
    assert "RATE: key" in report.render()


def test_memory_rate_limits_pass_without_the_plant(tmp_path: Path) -> None:
    report = _run("memory://", None, 4, tmp_path)
    assert report.verdict == "ok", report.render()
    assert report.kinds["rate"] > 0


def test_sqlite_rate_plant_is_caught_and_the_real_limit_passes(tmp_path: Path) -> None:
    bad = _run(f"sqlite:///{tmp_path / 'p.db'}", "rate-over-limit", 1, tmp_path, clients=3)
    assert bad.verdict == "anomaly", bad.render()
    assert {e["kind"] for e in bad.evidence()} == {"rate-limit"}
    good = _run(f"sqlite:///{tmp_path / 'g.db'}", None, 2, tmp_path, clients=3)
    assert good.verdict == "ok", good.render()
    assert good.kinds["rate"] > 0


def test_postgres_rate_plant_is_caught(pg_url: str, tmp_path: Path) -> None:
    bad = _run(schema_url(pg_url, "rate_plant"), "rate-over-limit", 1, tmp_path, clients=3)
    assert bad.verdict == "anomaly", bad.render()
    assert {e["kind"] for e in bad.evidence()} == {"rate-limit"}


def test_cli_exits_1_on_the_rate_plant(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["verify", "--clients", "4", "--ops", "400", "--plant", "rate-over-limit"])
    assert code == 1
    assert "RATE: key" in capsys.readouterr().out
