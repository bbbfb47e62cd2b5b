"""The options every ``dibs`` command that takes a store shares, defined once."""

from __future__ import annotations

import argparse

from dibs.stores import DEFAULT_URL

__all__ = ["STORE_DEFAULT", "add_store_option"]

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
