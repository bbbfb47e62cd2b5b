"""``dibs worker``: a real subprocess runs an app's durable jobs and drains on SIGTERM."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import dibs
from dibs.cli import main
from dibs.tasks import TaskProcessor
from eventually import eventually

GUARD = 60.0  # real seconds before a wait is declared hung

APP = """
import sqlite3, sys
import dibs
from dibs.tasks import TaskProcessor, current

processor = TaskProcessor(store=dibs.open(), workers=1, lease=5, poll=0.02)
ledger = sqlite3.connect(sys.argv[-1], isolation_level=None, check_same_thread=False)

@processor.task("step")
def step(n, seconds):
    ledger.execute("INSERT INTO effects VALUES (?, 'started')", (n,))
    if seconds == "forever":
        current().token.sleep(3600)  # until the shutdown deadline sets the token
        current().raise_if_cancelled()
    else:
        current().token.sleep(seconds)
    ledger.execute("INSERT INTO effects VALUES (?, 'finished')", (n,))
    return n
"""


def start_worker(tmp_path: Path, timeout: float) -> tuple[subprocess.Popen[str], Path, str]:
    (tmp_path / "app_under_test.py").write_text(APP)
    ledger = tmp_path / "ledger.db"
    with sqlite3.connect(ledger) as conn:
        conn.execute("CREATE TABLE effects (n INTEGER, what TEXT)")
    url = f"sqlite:///{tmp_path / 'dibs.db'}"
    code = "import sys; from dibs.cli import main; sys.exit(main(sys.argv[1:-1]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "worker", "--store", url, "--app",
         "app_under_test:processor", "--timeout", str(timeout), str(ledger)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert "running" in proc.stdout.readline()
    return proc, ledger, url


def effects(ledger: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(ledger, timeout=30) as conn:
        return conn.execute("SELECT n, what FROM effects").fetchall()


def wait_for_start(ledger: Path) -> None:
    eventually(lambda: effects(ledger), "the worker started a job", timeout=GUARD)


def client(url: str) -> tuple[TaskProcessor, dibs.Store]:
    store = dibs.open(url)
    processor = TaskProcessor(store=store, workers=1, take_jobs=False)
    processor.task("step")(lambda *a: None)  # the name only: this process runs nothing
    return processor, store


def test_sigterm_drains_the_running_job_then_exits_0(tmp_path: Path) -> None:
    proc, ledger, url = start_worker(tmp_path, timeout=30)
    tasks, store = client(url)
    running = tasks.enqueue("step", 1, 0.5)
    wait_for_start(ledger)
    waiting = tasks.enqueue("step", 2, 0.0, delay=0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=GUARD)
    assert proc.returncode == 0, err
    assert "draining" in out and "stopped" in out
    record = tasks.job(running)
    assert record is not None and (record.state, record.result) == ("done", 1)
    # The job still waiting when the signal came was left for another worker.
    assert effects(ledger) in ([(1, "started"), (1, "finished")],
                               [(1, "started"), (1, "finished"), (2, "started"),
                                (2, "finished")])  # fmt: skip
    left = tasks.job(waiting)
    assert left is not None and left.state in ("pending", "done")
    tasks.shutdown()
    store.close()


def test_sigterm_deadline_cancels_the_running_job_for_another_worker(tmp_path: Path) -> None:
    proc, ledger, url = start_worker(tmp_path, timeout=0.2)
    tasks, store = client(url)
    job = tasks.enqueue("step", 7, "forever")
    wait_for_start(ledger)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=GUARD)
    assert proc.returncode == 0, err
    assert effects(ledger) == [(7, "started")]
    record = tasks.job(job)
    assert record is not None and record.state == "running"  # unrecorded: taken over later
    tasks.shutdown()
    store.close()


@pytest.mark.parametrize(
    "app", ["no_colon", "app_missing_module:x", "dibs:open_nothing", "dibs:__version__"]
)
def test_worker_rejects_a_bad_app(app: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--app", app]) == 2  # no --store: this process's $DIBS_URL stays
    err = capsys.readouterr().err
    assert err.startswith("dibs: error:") and app.split(":", maxsplit=1)[0] in err
