"""Stopping the worker processes a test started: one way, whatever the test did to them.

A worker reads its stdin and shuts down cleanly when it closes. The test may
have paused one (SIGSTOP: it is resumed first) or killed one (its pipe is
broken: that is fine); one that does not stop within the guard is killed, so
a test never leaves a process behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable


def stop_workers(procs: Iterable[subprocess.Popen[str]], timeout: float = 60.0) -> None:
    """Ask every live worker to stop (close its stdin), wait for each, kill the laggards,
    and close the pipes."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a paused worker could not read its stdin
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # killed by the test
                proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
