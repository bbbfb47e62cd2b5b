"""The postgresql:// store: its store, statements, job table and SQL, in one package.

``dibs.stores.postgres.PostgresStore`` is the public path; the modules inside are
private. Importing this package needs the postgres extra (psycopg); without it,
any import of it raises :class:`~dibs.MissingExtra`.
"""

from dibs._extras import needs

with needs("postgres", "the postgresql:// store"):
    from dibs.stores.postgres._store import SCHEMA_VERSION, PostgresStore, parse_id, split_url

__all__ = ["SCHEMA_VERSION", "PostgresStore", "parse_id", "split_url"]

PostgresStore.__module__ = __name__  # the public path, in reprs and docs
