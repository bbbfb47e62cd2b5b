"""A store from outside dibs: ``toy://``, the memory store under another scheme.

It uses only dibs's public API, as a third-party package would. Its claim
contract and its capabilities (job table, change feed, claim log) are the
memory store's, inherited; a store of its own would implement the
``_``-methods of :class:`dibs.Store` instead.
"""

from __future__ import annotations

from typing import Any

import dibs
from dibs.stores.memory import MemoryStore


class ToyStore(MemoryStore):
    """Claims in this process, opened from ``toy://``."""

    scheme = "toy"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> ToyStore:
        """Open from ``toy://`` (the URL carries nothing else)."""
        if url.split("://", 1)[1] not in ("", "/"):
            raise dibs.InvalidInput(f"toy:// takes no path, got {url!r}", field="url", value=url)
        return cls(**options)
