"""The accepted input domain: the edges every store checks the same way.

Everything outside them raises :class:`~dibs.InvalidInput` before a backend
sees it; docs/stores.md has the whole table.
"""

__all__ = [
    "NAME_MAX_BYTES",
    "NUMBER_MAX",
    "NUMBER_MIN",
    "RATE_LIMIT_MAX",
    "RETENTION_MAX",
    "RETENTION_MIN",
    "TTL_MAX",
    "TTL_MIN",
]

NAME_MAX_BYTES = 1024
"""Longest resource, slot, holder, request ID or claim ID, in UTF-8 bytes."""
TTL_MIN = 0.001
"""Shortest hold, in seconds: the SQL stores keep time in microseconds."""
TTL_MAX = 366 * 24 * 3600.0
"""Longest hold, in seconds (a year and a day)."""
RETENTION_MIN = 1.0
"""Shortest request retention, in seconds."""
RETENTION_MAX = 3660 * 24 * 3600.0
"""Longest request retention, in seconds (about ten years)."""
NUMBER_MIN = -(2**63)
"""Smallest numeric span bound: what a signed 64-bit column holds."""
NUMBER_MAX = 2**63 - 1
"""Largest numeric span bound, and largest fence."""
RATE_LIMIT_MAX = 10_000
"""Most units a :class:`~dibs.RateLimit` admits per window (one slot unit each, in the store)."""
