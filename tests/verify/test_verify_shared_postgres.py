"""``dibs verify`` with shared claims on PostgreSQL: the real store passes, the
``reader-beside-writer`` plant (a schema whose readers do not look at writers) is flagged
every run."""

from __future__ import annotations

import pytest

from dibs.cli import main
from pg_fixtures import schema_url

SEEDS = ["1", "2", "3"]


def test_verify_with_readers_and_writers_passes_on_postgres(
    pg_schema_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verify", "--store", pg_schema_url, "--clients", "4", "--ops", "200"]
    assert main(argv) == 0
    assert "verdict: OK" in capsys.readouterr().out


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_flags_a_reader_beside_a_writer_on_postgres(
    pg_url: str, seed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = schema_url(pg_url, f"rbw_{seed}")
    argv = ["verify", "--store", url, "--clients", "4", "--ops", "300",
            "--seed", seed, "--plant", "reader-beside-writer"]  # fmt: skip
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "verdict: ANOMALY" in out
    # The readers granted over live writers: a history no order explains, and in
    # the log a grant over a live claim (or the writer's claim gone from it, as the
    # plant rewrote its row: lost-claim).
    kinds = ("NOT LINEARIZABLE", "grant-over-live-claim", "lost-claim")
    assert any(kind in out for kind in kinds), out
