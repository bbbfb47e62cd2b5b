"""``dibs worker``: load an application's processor and run it until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import dibs
from dibs._model import shown
from dibs.exceptions import InvalidInput, MissingExtra
from dibs.tasks._processor import QUEUES_ENV, TaskProcessor
from dibs.tasks._time import DURATION_MAX, to_seconds

__all__ = ["load_app", "run_worker"]


def load_app(
    spec: str, store_url: str | None, queues: Sequence[str] | None = None
) -> TaskProcessor:
    """Import ``module:attribute`` and return the processor it names.

    The attribute is a :class:`TaskProcessor` (built at import; it reads the
    store from ``$DIBS_URL``, which ``store_url`` sets first) or a callable
    taking the opened store and returning one. ``queues`` sets
    ``$DIBS_QUEUES`` first, the queues a processor built without ``queues=``
    takes jobs from. Raises
    :class:`~dibs.InvalidInput` if the module or attribute cannot be found or
    is neither.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidInput(f"--app must be module:attribute, got {spec!r}", field="app", value=spec)
    if store_url is not None:
        os.environ["DIBS_URL"] = store_url  # read by dibs.open() in the app's module
    if queues:
        os.environ[QUEUES_ENV] = json.dumps(list(queues))  # read by TaskProcessor()
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: apps next to the caller import
    try:
        module = importlib.import_module(module_name)
    except MissingExtra:
        raise  # the app reached a store or feature whose extra is missing: say which
    except ImportError as exc:
        raise InvalidInput(
            f"cannot import {module_name!r}: {exc}", field="app", value=spec
        ) from None
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidInput(
                f"module {module_name!r} has no attribute {attribute!r}", field="app", value=spec
            ) from None
    if isinstance(target, TaskProcessor):
        return target
    if callable(target):
        made = target(dibs.open(store_url))
        if isinstance(made, TaskProcessor):
            return made
    raise InvalidInput(
        f"{spec} is neither a TaskProcessor nor a function of a store returning one",
        field="app",
        value=spec,
    )


class _Stop(Exception):
    """The first SIGTERM or SIGINT, raised out of the worker's idle wait."""


def drain_seconds(text: str) -> float:
    """``dibs worker --timeout``: what ``TaskProcessor.shutdown(timeout=)`` takes, checked
    when the worker starts rather than refused at its SIGTERM."""
    try:
        value: object = float(text)
    except ValueError:
        value = text
    try:
        return to_seconds(value, "timeout", allow_zero=True)
    except InvalidInput:
        raise argparse.ArgumentTypeError(
            f"expected seconds from 0 to {DURATION_MAX:g}, got {shown(text)}"
        ) from None


def run_worker(
    processor: TaskProcessor, timeout: float, announce: Callable[[str], None] = print
) -> None:
    """Run ``processor`` until SIGTERM or SIGINT, then shut it down, draining for ``timeout`` s.

    Must be called from the main thread (signal handlers live there).
    """
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Raised into the main thread's sleep below, the only code it runs until then;
        # later signals are only recorded, so the drain itself is never interrupted.
        received.append(signum)
        if len(received) == 1:
            raise _Stop

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        announce(f"dibs worker {os.getpid()}: running; SIGTERM or Ctrl-C drains and stops")
        try:
            while True:
                time.sleep(3600)
        except _Stop:
            pass
        name = signal.Signals(received[0]).name
        announce(f"dibs worker {os.getpid()}: {name}; draining for up to {timeout:g}s")
        processor.shutdown(wait=True, timeout=timeout)
        store = processor.store
        if store is not None:
            store.close()
        announce(f"dibs worker {os.getpid()}: stopped")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
