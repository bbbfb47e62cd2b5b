"""Each store against the pure model, driven by Hypothesis with a fake clock."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import dibs
from aio_face import open_face
from dibs import FakeClock, Store
from dibs.testing import StoreStateMachine

# Each machine runs a fixed number of examples: seconds on an idle machine, minutes on
# a shared one under a parallel suite. The guard is against a hang, not a slow machine.
pytestmark = pytest.mark.timeout(900)

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last

_counter = itertools.count()


def _memory(clock: FakeClock, retention: float) -> Store:
    return dibs.open("memory://", clock=clock, request_retention=retention)


_tmp = Path(tempfile.mkdtemp(prefix="dibs-machine-"))


def _sqlite(clock: FakeClock, retention: float) -> Store:
    path = _tmp / f"m{next(_counter)}.db"
    return dibs.open(f"sqlite:///{path}", clock=clock, request_retention=retention)


def _aio_memory(clock: FakeClock, retention: float) -> Store:
    return open_face("memory://", clock=clock, request_retention=retention)  # type: ignore[return-value]


def _aio_sqlite(clock: FakeClock, retention: float) -> Store:
    path = _tmp / f"m{next(_counter)}.db"
    return open_face(f"sqlite:///{path}", clock=clock, request_retention=retention)  # type: ignore[return-value]


MACHINE_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


AIO_MACHINE_SETTINGS = settings(MACHINE_SETTINGS, max_examples=60)
"""The async face's runs: fewer examples, as the sync runs already search the rules hard."""


class MemoryMachine(StoreStateMachine):
    make_store = staticmethod(_memory)


class SQLiteMachine(StoreStateMachine):
    make_store = staticmethod(_sqlite)


TestMemoryMachine = MemoryMachine.TestCase
TestMemoryMachine.settings = MACHINE_SETTINGS
TestSQLiteMachine = SQLiteMachine.TestCase
TestSQLiteMachine.settings = MACHINE_SETTINGS


class AioMemoryMachine(StoreStateMachine):
    """The memory store through :func:`dibs.aio.open` (tests/support/aio_face.py)."""

    make_store = staticmethod(_aio_memory)


class AioSQLiteMachine(StoreStateMachine):
    """The SQLite store through :func:`dibs.aio.open` (tests/support/aio_face.py)."""

    make_store = staticmethod(_aio_sqlite)


TestAioMemoryMachine = AioMemoryMachine.TestCase
TestAioMemoryMachine.settings = AIO_MACHINE_SETTINGS
TestAioSQLiteMachine = AioSQLiteMachine.TestCase
TestAioSQLiteMachine.settings = AIO_MACHINE_SETTINGS
