"""``dibs jobs``: list, show, retry, cancel and purge, on SQLite and PostgreSQL.

Rows are made through the job table (add, take, finish), so each state is
set up exactly; the command runs in-process through ``dibs.cli.main``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import dibs
from conftest import StoreMaker
from dibs import InvalidInput
from dibs.cli import main
from dibs.stores.jobs import Job, JobTable
from dibs.tasks import TaskProcessor
from dibs.tasks._jobs import job_table


@pytest.fixture(params=["sqlite", "postgresql"])
def place(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreMaker]:
    pg = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    maker = StoreMaker(request.param, tmp_path, pg)
    yield maker
    maker.close()


@pytest.fixture
def table(place: StoreMaker) -> JobTable:
    return job_table(place())


def job(job_id: str, **fields: object) -> Job:
    row = {"name": "send", "args": json.dumps([[job_id], {}]), "run_at": None, "attempt": 1,
           "max_attempts": 4, "state": "pending", "retries": 0, **fields}  # fmt: skip
    return Job(id=job_id, **row)  # type: ignore[arg-type]


def finished(
    table: JobTable, job_id: str, kind: str, outcome: str | None, **fields: object
) -> None:
    table.add(job(job_id, **fields))
    (taken,) = table.take(None, 1, 30.0, "host:1:abc", names=[str(fields.get("name", "send"))])
    assert taken.id == job_id and taken.fence is not None
    assert table.finish(job_id, taken.fence, kind, outcome) is not None


@pytest.fixture
def jobs(table: JobTable) -> JobTable:
    """One job in each state, in two queues."""
    finished(table, "j-done", "ok", json.dumps({"sent": True}))
    finished(table, "j-failed", "error", "Traceback...\nKeyError: 'nope'\n")
    table.add(job("j-cancelled"))
    table.cancel("j-cancelled")
    table.add(job("j-mail", queue="mail", priority=7))
    table.add(job("j-running", name="slow"))
    table.take(None, 1, 30.0, "host:2:def", names=["slow"])
    return table


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_filters_by_state_and_queue(
    place: StoreMaker, jobs: JobTable, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "jobs", "list", "--store", place.url, "--json")
    assert code == 0
    assert {row["id"] for row in json.loads(out)} == {
        "j-done", "j-failed", "j-cancelled", "j-mail", "j-running"
    }  # fmt: skip
    code, out, _ = run(capsys, "jobs", "list", "--store", place.url, "--state", "failed",
                       "--state", "done", "--json")  # fmt: skip
    assert {row["id"] for row in json.loads(out)} == {"j-done", "j-failed"}
    code, out, _ = run(capsys, "jobs", "list", "--store", place.url, "--queue", "mail")
    assert code == 0 and "j-mail" in out and "j-done" not in out and "1 job(s)" in out
    _, out, _ = run(capsys, "jobs", "list", "--store", place.url, "--task", "slow", "--json")
    assert [row["state"] for row in json.loads(out)] == ["running"]


def test_show_prints_a_job_with_its_attempts(
    place: StoreMaker, jobs: JobTable, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "jobs", "show", "--store", place.url, "j-failed", "--json")
    assert code == 0
    shown = json.loads(out)
    assert shown["state"] == "failed" and "KeyError" in shown["error"]
    assert [(a["attempt"], a["holder"], a["outcome"]) for a in shown["attempts"]] == [
        (1, "host:1:abc", "error")
    ]
    code, out, _ = run(capsys, "jobs", "show", "--store", place.url, "j-done")
    assert code == 0 and '{"sent": true}' in out and "host:1:abc" in out
    code, out, _ = run(capsys, "jobs", "show", "--store", place.url, "j-running")
    assert "running" in out and "host:2:def" in out
    code, _, err = run(capsys, "jobs", "show", "--store", place.url, "j-nope")
    assert code == 1 and "no job 'j-nope'" in err


def test_retry_and_cancel_say_which_jobs_they_changed(
    place: StoreMaker, jobs: JobTable, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "jobs", "retry", "--store", place.url, "j-failed", "j-cancelled")
    assert code == 0 and out.count("retried") == 2
    assert {jobs.get(i).state for i in ("j-failed", "j-cancelled")} == {"pending"}  # type: ignore[union-attr]
    code, out, _ = run(capsys, "jobs", "retry", "--store", place.url, "j-done", "--json")
    assert code == 1 and json.loads(out) == {"j-done": False}

    code, out, _ = run(capsys, "jobs", "cancel", "--store", place.url, "j-mail", "j-running")
    assert code == 0
    assert jobs.get("j-mail").state == "cancelled"  # type: ignore[union-attr]
    running = jobs.get("j-running")
    assert running is not None and running.state == "running" and running.cancel_requested
    code, _, _ = run(capsys, "jobs", "cancel", "--store", place.url, "j-done", "j-nope")
    assert code == 1


def test_purge_deletes_finished_jobs_only(
    place: StoreMaker, jobs: JobTable, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "jobs", "purge", "--store", place.url, "j-done", "j-mail")
    assert code == 0 and "deleted 1" in out
    assert jobs.get("j-done") is None and jobs.get("j-mail") is not None
    # Within the store's retention (a day): the retention purge keeps them.
    code, out, _ = run(capsys, "jobs", "purge", "--store", place.url, "--json")
    assert json.loads(out) == {"deleted": 0}
    code, out, _ = run(capsys, "jobs", "purge", "--store", place.url, "--older-than", "0",
                       "--state", "failed", "--json")  # fmt: skip
    assert json.loads(out) == {"deleted": 1} and jobs.get("j-failed") is None
    code, out, _ = run(capsys, "jobs", "purge", "--store", place.url, "--older-than", "0")
    assert "deleted 1" in out  # j-cancelled; pending and running jobs stay
    assert {j.id for j in jobs.find()} == {"j-mail", "j-running"}
    code, _, err = run(capsys, "jobs", "purge", "--store", place.url, "j-mail", "--older-than", "0")
    assert code == 2 and "not both" in err


def test_commands_refuse_a_sqlite_store_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.db"
    for argv in (["list"], ["show", "j-1"], ["retry", "j-1"], ["cancel", "j-1"], ["purge"]):
        code, _, err = run(capsys, "jobs", *argv, "--store", f"sqlite:///{missing}")
        assert code == 2 and "no dibs store at" in err and "never creates one" in err
        assert "create=False" not in err  # the API's words, not the command line's
        assert not missing.exists()
    code, _, err = run(capsys, "jobs", "list", "--store", "memory://")
    assert code == 2 and "memory://" in err


def test_commands_refuse_a_postgresql_schema_that_does_not_exist(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import schema_url

    url = schema_url(pg_url, "never_made_here")
    code, _, _ = run(capsys, "jobs", "list", "--store", url)
    assert code == 2
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = 'never_made_here'"
        ).fetchone()
    assert row is None


def test_an_empty_store_lists_nothing(
    place: StoreMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    store = dibs.open(place.url)  # the store exists, with no job yet
    store.close()
    code, out, _ = run(capsys, "jobs", "list", "--store", place.url)
    assert code == 0 and "0 job(s)" in out


def test_names_the_api_refuses_are_refused_with_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A queue, task or job ID that enqueue() would refuse is a usage error (exit 2) naming it,
    before any store is opened, as the API's InvalidInput is."""
    url = f"sqlite:///{tmp_path / 'any.db'}"
    for argv in (["list", "--queue", ""], ["list", "--task", "a\0b"], ["show", ""],
                 ["retry", "ok", ""], ["cancel", "x" * 5000], ["purge", ""]):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            main(["jobs", *argv, "--store", url])
        _, err = capsys.readouterr()
        assert exited.value.code == 2 and "bad name" in err and "must" in err, (argv, err)
    with pytest.raises(SystemExit) as exited:  # a limit no store can hold
        main(["jobs", "list", "--limit", str(2**70), "--store", url])
    assert exited.value.code == 2 and str(2**70) in capsys.readouterr().err
    assert not (tmp_path / "any.db").exists()


def test_limit_means_what_jobs_limit_means(
    place: StoreMaker, jobs: JobTable, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--limit`` takes what ``TaskProcessor.jobs(limit=)`` takes, ``all`` for None. Before:
    ``--limit 0`` listed every job while ``jobs(limit=0)`` raised."""
    code, out, _ = run(capsys, "jobs", "list", "--store", place.url, "--limit", "2", "--json")
    assert code == 0 and len(json.loads(out)) == 2
    code, out, _ = run(capsys, "jobs", "list", "--store", place.url, "--limit", "all", "--json")
    assert code == 0 and len(json.loads(out)) == 5
    with dibs.open(place.url) as store:
        processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
        try:
            for wrong in (0, -1, 2**70):
                with pytest.raises(InvalidInput) as raised:
                    processor.jobs(limit=wrong)
                with pytest.raises(SystemExit) as exited:
                    main(["jobs", "list", "--store", place.url, "--limit", str(wrong)])
                _, err = capsys.readouterr()
                assert exited.value.code == 2 and raised.value.field == "limit", (wrong, err)
                assert "argument --limit: expected a whole number from 1 to 2**63 - 1" in err
        finally:
            processor.shutdown(timeout=60)
    for wrong in ("none", "1.5", "", "9" * 5000):
        with pytest.raises(SystemExit) as exited:
            main(["jobs", "list", "--store", place.url, "--limit", wrong])
        _, err = capsys.readouterr()
        assert exited.value.code == 2, (wrong, err)
        assert "argument --limit: expected a whole number from 1 to 2**63 - 1" in err, err
        assert len(err) < 1000, err  # the bad value is shown cut short
