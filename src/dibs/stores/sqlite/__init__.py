"""The sqlite:// store: its store, connection layer, job table and SQL, in one package.

``dibs.stores.sqlite.SQLiteStore`` is the public path; the modules inside are private.
"""

from dibs.stores.sqlite._store import SCHEMA_VERSION, SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SQLiteStore.__module__ = __name__  # the public path, in reprs and docs
