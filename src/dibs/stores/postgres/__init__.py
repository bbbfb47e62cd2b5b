"""The postgresql:// store: its store, statements, job table and SQL, in one package.

``dibs.stores.postgres.PostgresStore`` is the public path; the modules inside are
private. Importing this package needs the postgres extra (psycopg).
"""

from dibs.stores.postgres._store import SCHEMA_VERSION, PostgresStore, parse_id, split_url

__all__ = ["SCHEMA_VERSION", "PostgresStore", "parse_id", "split_url"]

PostgresStore.__module__ = __name__  # the public path, in reprs and docs
