"""Store backends, chosen by URL through an explicit scheme → class table."""

from __future__ import annotations

import importlib
import os
from typing import Any

from dibs.exceptions import InvalidInput, UnknownScheme
from dibs.stores.base import Store

__all__ = ["DEFAULT_URL", "SCHEMES", "Store", "open_store"]

DEFAULT_URL = "sqlite:///dibs.db"
"""The embedded default: a SQLite file ``dibs.db`` in the working directory."""

SCHEMES: dict[str, str] = {
    "memory": "dibs.stores.memory:MemoryStore",
    "sqlite": "dibs.stores.sqlite:SQLiteStore",
    "postgresql": "dibs.stores.postgres:PostgresStore",
    "postgres": "dibs.stores.postgres:PostgresStore",
}
"""URL scheme → ``module:Class``; imported on first use so extras stay optional."""


def open_store(url: str | None = None, **options: Any) -> Store:
    """Open the store named by ``url`` (default ``$DIBS_URL``, else ``sqlite:///dibs.db``).

    Keyword options go to the store's constructor (``clock=``,
    ``request_retention=`` and backend-specific ones). Raises
    :class:`~dibs.UnknownScheme` for a scheme no store handles and
    :class:`~dibs.InvalidInput` for a malformed URL.
    """
    if url is None:
        url = os.environ.get("DIBS_URL") or DEFAULT_URL
    if not isinstance(url, str) or "://" not in url:
        raise InvalidInput(
            f"store URL must look like 'scheme://...', got {url!r}", field="url", value=url
        )
    # Not urlsplit(): it raises a bare ValueError for a malformed host; the
    # store's from_url() parses the rest and says what is wrong.
    scheme = url.split("://", 1)[0].lower().split("+", 1)[0]
    try:
        target = SCHEMES[scheme]
    except KeyError:
        known = ", ".join(sorted(SCHEMES))
        raise UnknownScheme(
            f"no store handles URL scheme {scheme!r} in {url!r}; known schemes: {known}",
            field="url",
            value=url,
        ) from None
    module_name, class_name = target.split(":")
    cls: type[Store] = getattr(importlib.import_module(module_name), class_name)
    return cls.from_url(url, **options)  # type: ignore[attr-defined,no-any-return]
