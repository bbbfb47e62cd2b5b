"""``dibs verify`` with waiting-list ops in the history: the real list passes, and the
``waitlist-skips-head`` and ``waitlist-double-offer`` plants are flagged every run."""

from __future__ import annotations

import pytest

from dibs.cli import main
from dibs.verify._history import assemble
from dibs.verify._waitlist import waitlist_anomalies


def _op(
    client: str, seq: int, start: float, end: float, value: dict[str, object]
) -> list[dict[str, object]]:
    op = f"{client}.0.{seq}"
    args = {"res": "run-wl", "action": value.get("action", "free")}
    return [
        {"e": "i", "id": op, "c": client, "f": "waitlist", "a": args, "t": start, "w": 1.0},
        {"e": "ok", "id": op, "v": value, "t": end, "w": 2.0},
    ]


def _join(
    client: str, seq: int, start: float, end: float, holder: str, number: int
) -> list[dict[str, object]]:
    return _op(client, seq, start, end, {"action": "join", "holder": holder, "number": number})


def test_an_offer_past_a_surely_waiting_head_is_an_anomaly() -> None:
    events = (
        _join("a", 0, 1.0, 2.0, "a-1", 1)
        + _join("b", 0, 3.0, 4.0, "b-1", 2)
        + _op("c", 0, 5.0, 6.0, {"offers": [["b-1", "0"]]})
    )
    found = waitlist_anomalies(assemble(events).ops)
    assert len(found) == 1 and "ahead of it" in found[0]


def test_an_offer_racing_the_heads_join_or_its_own_offer_is_not_an_anomaly() -> None:
    racing_join = (
        _join("a", 0, 1.0, 5.5, "a-1", 1)
        + _join("b", 0, 3.0, 4.0, "b-1", 2)
        + _op("c", 0, 5.0, 6.0, {"offers": [["b-1", "0"]]})
    )
    assert waitlist_anomalies(assemble(racing_join).ops) == []
    head_offered_meanwhile = (
        _join("a", 0, 1.0, 2.0, "a-1", 1)
        + _join("b", 0, 3.0, 4.0, "b-1", 2)
        + _op("d", 0, 5.5, 7.0, {"offers": [["a-1", "1"]]})
        + _op("c", 0, 5.0, 6.0, {"offers": [["b-1", "0"]]})
    )
    assert waitlist_anomalies(assemble(head_offered_meanwhile).ops) == []


def test_two_offers_for_one_entry_is_an_anomaly() -> None:
    events = (
        _join("a", 0, 1.0, 2.0, "a-1", 1)
        + _op("c", 0, 3.0, 4.0, {"offers": [["a-1", "0"]]})
        + _op("d", 0, 5.0, 6.0, {"offers": [["a-1", "1"]]})
    )
    found = waitlist_anomalies(assemble(events).ops)
    assert len(found) == 1 and "offered 2 units" in found[0]


def test_verify_with_waitlist_ops_passes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["verify", "--clients", "4", "--ops", "150", "--mix", "waitlist=40"]
    assert main(argv) == 0
    assert "verdict: OK" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("plant", "says"),
    [("waitlist-skips-head", "ahead of it on the list"), ("waitlist-double-offer", "was offered")],
)
def test_verify_flags_a_broken_waitlist(
    plant: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verify", "--clients", "4", "--ops", "150", "--plant", plant]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "WAITLIST: " in out and says in out
