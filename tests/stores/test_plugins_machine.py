"""The state machine against the model, on a store registered by entry point (toy://)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

import dibs
from dibs import FakeClock, Store
from dibs.testing import StoreStateMachine
from layout import PLUGIN_DIR


@pytest.fixture(autouse=True, scope="module")
def _toy() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(PLUGIN_DIR))
        patch.setenv(
            "PYTHONPATH", os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")])
        )
        yield


def _open(clock: FakeClock, retention: float) -> Store:
    return dibs.open("toy://", clock=clock, request_retention=retention)


class ToyMachine(StoreStateMachine):
    make_store = staticmethod(_open)


TestToyMachine = ToyMachine.TestCase
TestToyMachine.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
