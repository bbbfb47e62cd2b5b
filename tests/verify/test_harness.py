"""dibs.verify.harness: installs nothing unless asked, and starts a server by hand.

The servers themselves are exercised by every PostgreSQL and etcd test (the
fixtures in tests/support are thin wrappers over the harness), by
tests/verify/test_server_reaping.py (they die with their owner) and by the
cluster tests.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import dibs
from dibs.verify.harness import ServerSetupError, _postgres, etcd_binary, find_pg_bindir
from dibs.verify.harness._process import find_program

pytestmark = pytest.mark.timeout(300)


def _fake_ensure(scripts: Path, name: str, marker: Path) -> None:
    script = scripts / name
    script.write_text(f"#!/bin/sh\n: > {marker}\necho no apt here >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_a_missing_server_installs_nothing_and_names_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a user's hands DIBS_HARNESS_ENSURE is unset: a script in the usual place never runs.
    marker = tmp_path / "ran"
    _fake_ensure(tmp_path, "etcd-ensure.sh", marker)
    monkeypatch.delenv("DIBS_HARNESS_ENSURE", raising=False)
    monkeypatch.delenv("DIBS_ETCD", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ServerSetupError) as caught:
        etcd_binary()
    assert "etcd-server" in str(caught.value) and "scripts/etcd-ensure.sh" in str(caught.value)
    assert not marker.exists()


def test_the_tests_let_it_run_the_ensure_script_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    _fake_ensure(tmp_path, "cluster-ensure.sh", marker)
    monkeypatch.setenv("DIBS_HARNESS_ENSURE", str(tmp_path))
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(
        ServerSetupError, match="dibs-no-such-program not found: install Debian's patroni"
    ):
        find_program("dibs-no-such-program", "patroni", "cluster-ensure.sh")
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ServerSetupError):
        find_program("dibs-no-such-program", "patroni", "cluster-ensure.sh")
    assert not marker.exists(), "the script ran twice in one process"


def test_a_missing_postgresql_is_a_setup_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "ran"
    _fake_ensure(tmp_path, "pg-ensure.sh", marker)
    monkeypatch.delenv("DIBS_HARNESS_ENSURE", raising=False)
    # A machine without PostgreSQL: no directory the harness looks in has a server.
    monkeypatch.setattr(_postgres, "_candidates", lambda: [tmp_path])
    with pytest.raises(ServerSetupError, match=r"postgresql package \(scripts/pg-ensure\.sh"):
        find_pg_bindir()
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["etcd", "postgresql"])
def test_python_m_harness_starts_a_server_by_hand_and_removes_it(kind: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "dibs.verify.harness", kind],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert child.stdout is not None
    try:
        url = child.stdout.readline().strip().removeprefix("DIBS_TEST_PG_URL=")
        assert url.startswith(f"{kind}://"), url
        store = dibs.open(f"{url}/hand" if kind == "etcd" else url)
        assert store.claim(dibs.Unit("seat", "1"), holder="alice")
        store.close()
        child.send_signal(signal.SIGTERM)
        assert child.wait(60) == 0
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    with pytest.raises(dibs.StoreUnavailable):
        dibs.open(f"{url}/hand?timeout=1" if kind == "etcd" else f"{url}?pool_timeout=1")


def test_a_start_waits_for_a_stop_under_way_in_another_thread(
    private_pg_server: _postgres.PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash (``stop("immediate")``) in one thread and a restart in another: the start
    runs only once the stop has ended. A start that ran while ``pg_ctl stop`` still waited
    put the new postmaster's PID where that stop looked, and it waited out its 60 s and
    failed (a loaded CI run of test_server_restart_mid_run_converges)."""
    server = private_pg_server
    real = server.pg_ctl
    calls: list[str] = []
    stopping, go, starting = threading.Event(), threading.Event(), threading.Event()

    def pg_ctl(*args: str) -> subprocess.CompletedProcess[str]:
        calls.append(args[0])
        if args[0] == "start":
            starting.set()
        done = real(*args)
        if args[0] == "stop":  # the server is down; the stop has not returned yet
            stopping.set()
            assert go.wait(60), "the test never let the stop return"
            calls.append("stop returned")
        return done

    monkeypatch.setattr(server, "pg_ctl", pg_ctl)
    crash = threading.Thread(target=server.stop, args=("immediate",))
    crash.start()
    assert stopping.wait(60)
    restart = threading.Thread(target=server.start)
    restart.start()
    try:
        # Unguarded, the start reaches pg_ctl at once; guarded, it waits for the stop.
        assert not starting.wait(2), "the start ran while the stop was under way"
    finally:
        go.set()
    crash.join(60)
    restart.join(120)
    assert calls == ["stop", "stop returned", "start"]
    assert server.running and server.pid() is not None
