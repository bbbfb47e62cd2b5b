"""Tools for testing code that uses dibs, and for testing a new store against the contract.

``FakeClock`` moves only when told. ``StoreContract`` is the contract suite
every store passes: subclass it in a pytest module and provide a ``store``
fixture (a fresh, empty store whose ``clock`` is a :class:`FakeClock`) and a
``reopen`` fixture (a callable returning another handle onto the same data)::

    from dibs.testing import StoreContract

    class TestMyStore(StoreContract):
        pass
"""

import contextlib

from dibs._clock import FakeClock
from dibs.testing.contract import StoreContract
from dibs.testing.model import ModelStore

# Hypothesis is only needed by whoever runs the state machine.
with contextlib.suppress(ImportError):
    from dibs.testing._machine import StoreStateMachine

__all__ = ["FakeClock", "ModelStore", "StoreContract", "StoreStateMachine"]
