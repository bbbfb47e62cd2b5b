"""A throwaway server's processes and directory outlive no process that made them.

:func:`reap_when_gone` starts a small watcher that reads a pipe from its
owner. When the pipe closes (the owner ended, however: a return, SIGTERM,
SIGINT, SIGKILL) it kills every process whose command line names the
directory, with its process group when that group is not the owner's, and
removes the directory. A clean close does the same with nothing left to find.
Servers restart on the same directory under new PIDs, so the command line,
not a PID, says what belongs to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["Reaper", "reap_when_gone"]

_WATCH = r"""
import os, shutil, signal, sys, time
root, owner_group = sys.argv[1].encode(), int(sys.argv[2])
sys.stdin.buffer.read()  # returns when every copy of the pipe's write end is closed

def named():
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if root in f.read():
                        yield int(entry)
            except OSError:
                pass

for _ in range(3):  # a postmaster may fork a last child while it dies
    for pid in list(named()):
        try:
            group = os.getpgid(pid)
            if group != owner_group:
                os.killpg(group, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
shutil.rmtree(root, ignore_errors=True)
"""


class Reaper:
    """The watcher of one directory; :meth:`close` when the directory is cleaned up."""

    def __init__(self, root: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WATCH, str(root), str(os.getpgrp())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a Ctrl-C to the owner's terminal must not stop it first.
            start_new_session=True,
        )

    def close(self, timeout: float = 30.0) -> None:
        """Let the watcher sweep (nothing, after a clean stop) and end; idempotent."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()


def reap_when_gone(root: Path) -> Reaper:
    """Watch ``root``: when this process ends, its processes are killed and it is removed."""
    return Reaper(root)
