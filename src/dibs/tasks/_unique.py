"""Unique jobs: at most one job per key, for a window, in chosen states (``@task(unique=…)``).

The rule is kept by the job table (:meth:`dibs.stores.jobs.JobTable.add_unique`):
a partial unique index on the key among the rows that count, written in the
transaction of the insert. This module only makes the key and checks the options.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from dibs._model import shown
from dibs.exceptions import InvalidInput
from dibs.stores.jobs import LIVE_STATES, STATE_BITS
from dibs.tasks._time import to_seconds

__all__ = ["MODES", "WINDOW_MIN", "Inserted", "Unique", "unique_key"]

WINDOW_MIN = 0.001
"""The shortest window, in seconds."""
MODES = ("refuse", "replace", "debounce")
"""What an enqueue does when a job already counts against its key."""


@dataclass(frozen=True)
class Unique:
    """At most one job of a task per key: ``@tasks.task(unique=Unique(...))``.

    ``key``: the argument names whose values make the key (a tuple or list; ``()``:
    one job per task), or a function of the job's arguments returning a str;
    None (the default): every argument. ``window``: seconds (or a timedelta, from
    :data:`WINDOW_MIN` to :data:`~dibs.tasks._time.DURATION_MAX`) a job
    counts against its key after it was enqueued or replaced; None: as long as it
    is in ``states``. ``states``: the job states in which it counts; ``pending``
    and ``running`` always do (a retry turns a running job pending again), and
    ``done``, ``failed``, ``cancelled`` may be added. ``mode``: ``refuse`` (the
    enqueue adds nothing and returns the counting job's ID), ``replace`` (a
    pending counting job gets the new arguments and due time), ``debounce``
    (likewise, due ``window`` seconds after the latest call). Raises
    :class:`~dibs.InvalidInput` (``field`` ``"unique.key"``, ``"unique.window"``,
    ``"unique.states"`` or ``"unique.mode"``) for a bad option.
    """

    key: Sequence[str] | Callable[..., str] | None = None
    window: float | timedelta | None = None
    states: Sequence[str] = LIVE_STATES
    mode: Literal["refuse", "replace", "debounce"] = "refuse"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidInput(
                f"unique mode must be one of {', '.join(MODES)}, got {shown(self.mode)}",
                field="unique.mode", value=self.mode,
            )  # fmt: skip
        key = self.key
        if isinstance(key, list | tuple):
            for name in key:
                if not isinstance(name, str) or not name.isidentifier():
                    raise InvalidInput(
                        f"unique key names arguments, got {shown(name)}",
                        field="unique.key", value=name,
                    )  # fmt: skip
            object.__setattr__(self, "key", tuple(key))
        elif key is not None and not callable(key):
            raise InvalidInput(
                "unique key must be a tuple of argument names, a function of the job's "
                f"arguments returning a str, or None (every argument), got {shown(key)}",
                field="unique.key", value=key,
            )  # fmt: skip
        if self.window is not None:
            # At least WINDOW_MIN: a shorter one vanishes in an epoch timestamp's rounding
            # (now + 1e-9 == now), and the job would stop counting as it is added.
            seconds = to_seconds(self.window, "unique.window", least=WINDOW_MIN)
            object.__setattr__(self, "window", seconds)
        states = self.states
        if isinstance(states, str) or not isinstance(states, Sequence | set | frozenset):
            raise InvalidInput(
                f"unique states must be a list of job states, got {shown(states)}",
                field="unique.states", value=states,
            )  # fmt: skip
        for state in states:
            if state not in STATE_BITS:
                raise InvalidInput(
                    f"no job state {shown(state)} (states: {', '.join(STATE_BITS)})",
                    field="unique.states", value=state,
                )  # fmt: skip
        if not set(LIVE_STATES) <= set(states):
            # A job that counted while pending but not running (or the reverse) would
            # make a second one count when a retry or a take moves it: the index refuses
            # that transition, in the middle of a worker's statement.
            raise InvalidInput(
                f"unique states must include pending and running, got {shown(states)}",
                field="unique.states", value=states,
            )  # fmt: skip
        ordered = tuple(s for s in STATE_BITS if s in states)
        object.__setattr__(self, "states", ordered)
        if self.mode == "debounce" and (self.window is None or ordered != LIVE_STATES):
            raise InvalidInput(
                "debounce needs a window (the quiet time before the job runs) and counts "
                "only pending and running jobs",
                field="unique.window" if self.window is None else "unique.states",
                value=self.window if self.window is None else self.states,
            )  # fmt: skip

    @property
    def seconds(self) -> float | None:
        """The window in seconds, or None."""
        return None if self.window is None else float(self.window)  # type: ignore[arg-type]

    @property
    def state_bits(self) -> int:
        """The states as the job table's bit mask."""
        return sum(STATE_BITS[s] for s in self.states)

    def check_task(self, fn: Callable[..., Any]) -> None:
        """Raise :class:`~dibs.InvalidInput` if a key name is not an argument of ``fn``."""
        if not isinstance(self.key, tuple):
            return
        params = _parameters(fn)
        if params is None or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return  # any name may come
        for name in self.key:
            if name not in params:
                raise InvalidInput(
                    f"unique key names {name!r}, which is not an argument of the task",
                    field="unique.key", value=name,
                )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Inserted:
    """What :meth:`TaskProcessor.insert` did: the job ID and the outcome.

    ``outcome``: ``added`` (a new job), ``duplicate`` (a job counting against the
    key stands; ``job_id`` is its ID and nothing was added) or ``replaced`` (the
    pending job holding the key got the new arguments and due time; ``job_id``
    is its ID).
    """

    job_id: str
    outcome: Literal["added", "duplicate", "replaced"]

    @property
    def duplicate(self) -> bool:
        """Whether another job held the key and this call added nothing."""
        return self.outcome == "duplicate"


@functools.lru_cache(maxsize=1024)
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature``, once per task function (it costs more than the rest of a key)."""
    return inspect.signature(fn)


def _parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(_signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return None


def unique_key(
    unique: Unique, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    """The job table's key of a call: ``u:`` and the SHA-256 of the task name and its key.

    Hashed: a key of any length (arguments may be large) fits the index. Raises
    :class:`~dibs.InvalidInput` (``field="unique.key"``) for a key function that
    returns no non-empty str, a named argument the call lacks, or a value JSON
    cannot hold.
    """
    if callable(unique.key):
        made = unique.key(*args, **kwargs)
        if not isinstance(made, str) or not made:
            raise InvalidInput(
                f"unique key function must return a non-empty str, got {shown(made)}",
                field="unique.key", value=made,
            )  # fmt: skip
        try:
            made.encode()
        except UnicodeEncodeError:
            raise InvalidInput(
                f"unique key has a lone surrogate: {shown(made)}", field="unique.key", value=made
            ) from None
        material: object = ["fn", name, made]
    else:
        bound = _bound(fn, args, kwargs)
        if unique.key is None:
            material = ["all", name, bound]
        else:
            extra: Any = next(
                (v for p, v in bound.items() if _kind(fn, p) is inspect.Parameter.VAR_KEYWORD),
                {},
            )
            picked = {}
            for key in unique.key:
                if key in bound:
                    picked[key] = bound[key]
                elif isinstance(extra, dict) and key in extra:
                    picked[key] = extra[key]
                else:
                    raise InvalidInput(
                        f"unique key names {key!r}, which this call does not give",
                        field="unique.key", value=key,
                    )  # fmt: skip
            material = ["args", name, picked]
    try:
        text = json.dumps(material, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(
            f"unique key must be made of JSON values: {exc}", field="unique.key", value=None
        ) from None
    return "u:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _kind(fn: Callable[..., Any], name: str) -> Any:
    params = _parameters(fn)
    return None if params is None or name not in params else params[name].kind


def _bound(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The call's arguments by parameter name, defaults filled in: ``f(1)`` and ``f(x=1)``
    make one key. A function without a signature: ``{"args": …, "kwargs": …}``."""
    try:
        signature = _signature(fn)
    except (TypeError, ValueError):
        return {"args": list(args), "kwargs": kwargs}
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidInput(
            f"the arguments do not fit the task: {exc}", field="args", value=list(args)
        ) from None
    bound.apply_defaults()
    return dict(bound.arguments)
