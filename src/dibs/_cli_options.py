"""Options shared by every ``dibs`` command that takes a store, and the option types."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from dibs.exceptions import StoreMisconfigured
from dibs.stores import DEFAULT_URL, default_url, open_store, redact, store_class

if TYPE_CHECKING:
    from dibs.stores.base import Store

__all__ = [
    "STORE_DEFAULT",
    "add_store_option",
    "count",
    "open_existing",
    "port",
    "positive_int",
    "positive_number",
    "seconds",
    "seconds_or_zero",
    "whole_number",
]

STORE_DEFAULT = f"$DIBS_URL, else {DEFAULT_URL}"
"""How the default store reads in help texts: what :func:`dibs.stores.default_url` answers."""


def add_store_option(
    parser: argparse.ArgumentParser,
    what: str,
    *,
    default: str | None = None,
    default_help: str = STORE_DEFAULT,
) -> None:
    """Add ``--store URL`` to ``parser``; ``what`` says what the command does with the store.

    Any scheme :func:`dibs.open` knows is accepted, plug-ins included. With
    ``default=None`` the command passes None on, and :func:`dibs.open` falls
    back to :func:`dibs.stores.default_url`.
    """
    parser.add_argument(
        "--store",
        metavar="URL",
        default=default,
        help=f"{what}: memory://, sqlite:///path.db, postgresql://user@host/db or a "
        f"plug-in store's URL (default: {default_help})",
    )


def open_existing(store: str | None, doing: str) -> Store:
    """Open the store ``--store`` names (or the default), refusing one that does not exist.

    For commands that only read or maintain a store: a URL with a typo must
    not make a new, empty store. ``doing`` says what the command does with it,
    for the message ("sweep maintains", "dibs jobs reads").
    """
    url = store or default_url()
    if store_class(url).exists(url) is False:
        given = "" if store else f" (no --store given, so the default: {STORE_DEFAULT})"
        raise StoreMisconfigured(
            f"no dibs store at {redact(url)}{given}; {doing} an existing store and never "
            "creates one",
            cause="the store does not exist",
        )
    return open_store(url, create=False)


# --- option types: argparse prints their message as is, so it speaks to the user ---------------


def _integer(text: str, low: int | None, high: int | None, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def whole_number(text: str) -> int:
    """``int`` for argparse, with a message that names no function."""
    return _integer(text, None, None, "a whole number")


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    return _integer(text, 1, None, "a whole number of at least 1")


def count(text: str) -> int:
    """A whole number >= 0."""
    return _integer(text, 0, None, "a whole number of at least 0")


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: the system picks one)."""
    return _integer(text, 0, 65535, "a port number from 0 to 65535")


def _float(text: str, what: str, ok: Callable[[float], bool]) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    return _float(text, "a positive number of seconds", lambda v: 0 < v < math.inf)


def seconds_or_zero(text: str) -> float:
    """A finite number of seconds >= 0."""
    return _float(text, "a number of seconds >= 0", lambda v: 0 <= v < math.inf)


def positive_number(text: str) -> float:
    """A positive, finite number."""
    return _float(text, "a positive number", lambda v: 0 < v < math.inf)
