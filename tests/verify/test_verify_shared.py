"""``dibs verify`` with shared claims in the workload: the real stores pass, the
``reader-beside-writer`` plant (readers that do not look at writers) is flagged every run."""

from __future__ import annotations

from pathlib import Path

import pytest

from dibs.cli import main
from dibs.verify._history import LogRow
from dibs.verify._log import replay_log

SEEDS = ["1", "2", "3"]


def _url(kind: str, tmp_path: Path) -> str:
    return "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'v.db'}"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_verify_with_readers_and_writers_passes(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verify", "--store", _url(kind, tmp_path), "--clients", "4", "--ops", "200"]
    assert main(argv) == 0
    assert "verdict: OK" in capsys.readouterr().out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_verify_flags_a_reader_beside_a_writer(
    kind: str, seed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verify", "--store", _url(kind, tmp_path), "--clients", "4", "--ops", "200",
            "--seed", seed, "--plant", "reader-beside-writer"]  # fmt: skip
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "verdict: ANOMALY" in out
    assert "grant-over-live-claim" in out


def _row(fence: int, mode: str, start: int, end: int) -> LogRow:
    """A hold on one unit that lived from ``start`` until it expired at ``end`` (µs)."""
    return LogRow(
        id=str(fence), fence=fence, holder=f"h{fence}", targets=(("u", "doc", "1"),),
        state="expired", created_at=start, expires_at=end, updated_at=end, taken_over=False,
        mode=mode,
    )  # fmt: skip


def test_the_log_replay_lets_readers_overlap_and_no_one_beside_a_writer() -> None:
    readers = [_row(1, "shared", 0, 50), _row(2, "shared", 10, 60), _row(3, "exclusive", 60, 70)]
    assert replay_log([], readers) == []
    bad = [_row(1, "shared", 0, 50), _row(2, "exclusive", 40, 60)]
    found = replay_log([], bad)
    assert [a.kind for a in found] == ["grant-over-live-claim"]
    after = [_row(1, "exclusive", 0, 50), _row(2, "shared", 60, 70), _row(3, "shared", 45, 80)]
    assert "grant-over-live-claim" in [a.kind for a in replay_log([], after)]
