"""``dibs verify`` with renewals by claim ID (:func:`dibs.renew`, the workload's ``extend``):
the real renewal passes, and the ``renew-ignores-fence`` plant (a renewal that looks up the
claim's fence instead of using the one it was given) is flagged every run, by the
linearizability search and by the log replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from dibs.cli import main
from dibs.verify._planted import ALL_PLANTS


def test_the_plant_is_listed() -> None:
    assert "renew-ignores-fence" in ALL_PLANTS


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_verify_flags_a_renew_that_ignores_the_fence(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp_path / 'v.db'}"
    argv = ["verify", "--store", url, "--clients", "4", "--ops", "150"]
    assert main([*argv, "--plant", "renew-ignores-fence"]) == 1
    out = capsys.readouterr().out
    assert "verdict: ANOMALY" in out
    assert "stale-fence-accepted: extend of claim" in out


def test_verify_with_renewals_by_id_passes(capsys: pytest.CaptureFixture[str]) -> None:
    # The same workload without the plant: its extends are dibs.renew, and they pass.
    argv = ["verify", "--clients", "4", "--ops", "150", "--mix", "transition=80"]
    assert main(argv) == 0
    assert "verdict: OK" in capsys.readouterr().out
