"""The PostgreSQL store against the pure model, driven by Hypothesis with a fake clock."""

from __future__ import annotations

import secrets

import pytest
from hypothesis import HealthCheck, settings

import dibs
from aio_face import open_face
from dibs import FakeClock, Store
from dibs.testing import StoreStateMachine
from pg_fixtures import drop_schema, schema_url, session_database

# Each machine runs a fixed number of examples: seconds on an idle machine, minutes on
# a shared one under a parallel suite. The guard is against a hang, not a slow machine.
pytestmark = pytest.mark.timeout(900)

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last


def _postgres(clock: FakeClock, retention: float) -> Store:
    url, _ = session_database()
    schema = f"m_{secrets.token_hex(6)}"
    store = dibs.open(schema_url(url, schema), clock=clock, request_retention=retention, pool_max=2)
    store.dropped_schema = (url, schema)  # type: ignore[attr-defined]
    return store


def _aio_postgres(clock: FakeClock, retention: float) -> Store:
    url, _ = session_database()
    schema = f"m_{secrets.token_hex(6)}"
    store = open_face(schema_url(url, schema), clock=clock, request_retention=retention, pool_max=2)
    store.dropped_schema = (url, schema)  # type: ignore[attr-defined]
    return store  # type: ignore[return-value]


class PostgresMachine(StoreStateMachine):
    make_store = staticmethod(_postgres)

    def teardown(self) -> None:
        super().teardown()
        drop_schema(*self.store.dropped_schema)  # type: ignore[attr-defined]


TestPostgresMachine = PostgresMachine.TestCase
TestPostgresMachine.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class AioPostgresMachine(PostgresMachine):
    """The PostgreSQL store through :func:`dibs.aio.open` (tests/support/aio_face.py)."""

    make_store = staticmethod(_aio_postgres)


TestAioPostgresMachine = AioPostgresMachine.TestCase
TestAioPostgresMachine.settings = settings(TestPostgresMachine.settings, max_examples=20)
