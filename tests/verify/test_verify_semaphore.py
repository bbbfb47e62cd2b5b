"""``dibs verify`` with semaphore holds in the history: the real semaphore passes, the
``semaphore-n-plus-one`` plant (one slot too many) is flagged every run."""

from __future__ import annotations

import pytest

from dibs.cli import main
from dibs.verify._check import semaphore_anomalies
from dibs.verify._history import assemble


def _hold(client: str, seq: int, entered: float, left: float) -> list[dict[str, object]]:
    op = f"{client}.0.{seq}"
    args = {"res": "run-sem", "holder": f"{client}-sem", "permits": 2}
    value = {"granted": True, "lost": False, "entered": entered, "left": left, "slot": 0}
    return [
        {"e": "i", "id": op, "c": client, "f": "semaphore", "a": args, "t": entered, "w": 1.0},
        {"e": "ok", "id": op, "v": value, "t": left, "w": 2.0},
    ]


def test_three_holds_at_once_under_two_permits_is_an_anomaly() -> None:
    events = _hold("a", 0, 1.0, 4.0) + _hold("b", 0, 2.0, 5.0) + _hold("c", 0, 3.0, 6.0)
    found = semaphore_anomalies(assemble(events).ops)
    assert len(found) == 1 and "3 holders" in found[0]


def test_holds_that_only_touch_are_not_at_once() -> None:
    events = _hold("a", 0, 1.0, 2.0) + _hold("b", 0, 1.5, 3.0) + _hold("c", 0, 2.0, 4.0)
    assert semaphore_anomalies(assemble(events).ops) == []


def test_verify_with_semaphore_holds_passes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["verify", "--clients", "4", "--ops", "150", "--mix", "semaphore=20"]
    assert main(argv) == 0
    assert "verdict: OK" in capsys.readouterr().out


def test_verify_flags_a_semaphore_with_one_permit_too_many(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["verify", "--clients", "4", "--ops", "150", "--plant", "semaphore-n-plus-one"]
    assert main(argv) == 1
    assert "SEMAPHORE: 3 holders" in capsys.readouterr().out
