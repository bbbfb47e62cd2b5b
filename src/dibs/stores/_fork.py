"""What a forked child does with connections it inherited: leave them alone, forever.

A connection object copied into a child by ``fork()`` shares its socket or file
with the parent's. Closing it in the child (``sqlite3_close``, libpq's
``PQfinish``, which sends the server a Terminate message) ends or corrupts the
parent's session, and so does using it. So a child keeps such objects alive
and untouched until it exits, with a reference nobody drops: not even the
interpreter's shutdown deallocates (closes) them.
"""

from __future__ import annotations

import ctypes

__all__ = ["abandon"]


def abandon(*objects: object) -> None:
    """Keep ``objects`` alive and unclosed for the life of this process."""
    for obj in objects:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
