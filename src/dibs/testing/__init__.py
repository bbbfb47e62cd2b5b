"""Tools for testing code that uses dibs, and for testing a new store against the contract.

``FakeClock`` moves only when told. ``StoreContract`` is the contract suite
every store passes: subclass it in a pytest module and provide a ``store``
fixture (a fresh, empty store whose ``clock`` is a :class:`FakeClock`) and a
``reopen`` fixture (a callable returning another handle onto the same data)::

    from dibs.testing import StoreContract

    class TestMyStore(StoreContract):
        pass

``StoreContract`` needs pytest and ``StoreStateMachine`` Hypothesis: ``pip install
'dibs[testing]'``. Without them, importing either raises :class:`~dibs.MissingExtra`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dibs._clock import FakeClock
from dibs.testing.model import ModelStore

if TYPE_CHECKING:
    from dibs.testing._machine import StoreStateMachine
    from dibs.testing.contract import StoreContract

__all__ = ["FakeClock", "ModelStore", "StoreContract", "StoreStateMachine"]

# Imported on first use: the contract needs pytest and the state machine Hypothesis (the
# testing extra), and each raises MissingExtra naming it when its package is missing, rather
# than leave the name undefined.
_WHERE = {"StoreContract": "dibs.testing.contract", "StoreStateMachine": "dibs.testing._machine"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'dibs.testing' has no attribute {name!r}")
