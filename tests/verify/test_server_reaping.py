"""Throwaway servers die with the process that made them: no member, no directory left.

A child process starts a server of dibs.verify.harness (an etcd member as the tests'
fixtures start it, a PostgreSQL server, a ``dibs verify --cluster`` etcd), and is then
ended by SIGTERM, SIGINT or SIGKILL, as CI, a Ctrl-C or the OOM killer would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eventually import eventually
from layout import SUPPORT

pytestmark = pytest.mark.timeout(300)

ETCD = """
from etcd_fixtures import cluster
c = cluster(1)
print(c.root, c.members[0].process.pid, flush=True)
"""
PG = """
from dibs.verify.harness import PostgresServer
s = PostgresServer()
s.start()
print(s.root, s.pid(), flush=True)
"""
VERIFY_ETCD = """
from dibs.verify.harness import EtcdCluster
c = EtcdCluster(1)
c.start()
print(c.root, c.members[0].pid, flush=True)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def named(root: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if root.encode() in cmdline and alive(int(entry)):
                found.append(int(entry))
    return found


def start(body: str) -> tuple[subprocess.Popen[str], str, int]:
    # SIGINT handled as at a terminal, even when this run inherited it ignored (a
    # background job of a script): else the SIGINT case would test nothing.
    code = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
    code += f"import sys, time\nsys.path.insert(0, {str(SUPPORT)!r})\n"
    code += textwrap.dedent(body) + "\ntime.sleep(3600)\n"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    root, pid = child.stdout.readline().split()
    assert Path(root).is_dir() and alive(int(pid))
    return child, root, int(pid)


def stop(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait()
    if child.stdout is not None:
        child.stdout.close()


def gone(root: str, pid: int, patience: float = 120.0) -> bool:
    """Wait (generously: this is no timing check) for the server and its directory to go."""
    try:
        eventually(
            lambda: not alive(pid) and not named(root) and not Path(root).exists(),
            f"server {pid} and {root} are gone",
            timeout=patience,
        )
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
@pytest.mark.parametrize("body", [ETCD, PG, VERIFY_ETCD], ids=["etcd", "postgresql", "verify"])
def test_a_server_dies_with_its_owner(body: str, sig: signal.Signals) -> None:
    child, root, pid = start(body)
    try:
        child.send_signal(sig)
        child.wait(60)
        assert gone(root, pid), f"left behind: {named(root)} in {root}"
    finally:
        stop(child)
        for leftover in named(root):
            os.kill(leftover, signal.SIGKILL)


def test_a_pytest_run_killed_by_sigterm_leaves_no_etcd(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(SUPPORT)!r})\n")
    (tmp_path / "test_hang.py").write_text(
        textwrap.dedent(
            """
            import time
            from etcd_fixtures import etcd_url, session_cluster

            def test_hang(etcd_url):
                c = session_cluster()
                print("ROOT", c.root, c.members[0].process.pid, flush=True)
                time.sleep(3600)
            """
        )
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        line = next(line for line in child.stdout if line.startswith("ROOT"))
        _, root, pid = line.split()
        child.send_signal(signal.SIGTERM)
        child.wait(60)
        assert gone(root, int(pid)), f"left behind: {named(root)} in {root}"
    finally:
        stop(child)
