"""The etcd store against the pure model, driven by Hypothesis with a fake clock.

With a test clock the store judges expiry on that clock instead of etcd
leases (see :class:`dibs.stores.etcd.EtcdStore`), so the model's exact TTLs
apply; tests/stores/test_etcd.py checks real leases.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

import dibs
from aio_face import open_face
from conftest import drop_etcd_prefix
from dibs import FakeClock, Store
from dibs.testing import StoreStateMachine
from etcd_fixtures import fresh_prefix, session_cluster

# Each machine runs a fixed number of examples: seconds on an idle machine, minutes on
# a shared one under a parallel suite. The guard is against a hang, not a slow machine.
pytestmark = pytest.mark.timeout(900)

RUN_EARLY = True  # long: started first under pytest -n (conftest), not last


def _etcd(clock: FakeClock, retention: float) -> Store:
    base, prefix = session_cluster().url(), fresh_prefix()
    store = dibs.open(f"{base}/{prefix}", clock=clock, request_retention=retention)
    store.dropped_prefix = (base, prefix)  # type: ignore[attr-defined]
    return store


def _aio_etcd(clock: FakeClock, retention: float) -> Store:
    base, prefix = session_cluster().url(), fresh_prefix()
    store = open_face(f"{base}/{prefix}", clock=clock, request_retention=retention)
    store.dropped_prefix = (base, prefix)  # type: ignore[attr-defined]
    return store  # type: ignore[return-value]


class EtcdMachine(StoreStateMachine):
    make_store = staticmethod(_etcd)

    def teardown(self) -> None:
        super().teardown()
        drop_etcd_prefix(*self.store.dropped_prefix)  # type: ignore[attr-defined]


TestEtcdMachine = EtcdMachine.TestCase
# Fewer runs than the SQL stores': each step's invariants read every unit, span and claim,
# about 30 round trips to etcd (the CI budget, DIST.md).
TestEtcdMachine.settings = settings(
    max_examples=15,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class AioEtcdMachine(EtcdMachine):
    """The etcd store through :func:`dibs.aio.open` (tests/support/aio_face.py)."""

    make_store = staticmethod(_aio_etcd)


TestAioEtcdMachine = AioEtcdMachine.TestCase
TestAioEtcdMachine.settings = settings(TestEtcdMachine.settings, max_examples=6)
