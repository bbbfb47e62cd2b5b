"""Each store against the pure model, driven by Hypothesis with a fake clock."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings

import dibs
from dibs import FakeClock, Store
from dibs.testing import StoreStateMachine

_counter = itertools.count()


def _memory(clock: FakeClock, retention: float) -> Store:
    return dibs.open("memory://", clock=clock, request_retention=retention)


_tmp = Path(tempfile.mkdtemp(prefix="dibs-machine-"))


def _sqlite(clock: FakeClock, retention: float) -> Store:
    path = _tmp / f"m{next(_counter)}.db"
    return dibs.open(f"sqlite:///{path}", clock=clock, request_retention=retention)


MACHINE_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class MemoryMachine(StoreStateMachine):
    make_store = staticmethod(_memory)


class SQLiteMachine(StoreStateMachine):
    make_store = staticmethod(_sqlite)


TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = MACHINE_SETTINGS
TestSQLiteMachine = SQLiteMachine.TestCase
TestSQLiteMachine.settings = MACHINE_SETTINGS
