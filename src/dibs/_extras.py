"""The one way dibs says an optional dependency is missing: :class:`~dibs.MissingExtra`.

Every import of a package that only an extra installs goes through
:func:`needs`, at the place that imports it (a store's package, a command, a
module of ``dibs.testing``), so whichever entry point reaches it first (``dibs.open``,
``dibs.aio.open``, a ``dibs`` command, a plain ``import``) gets the same
error naming the extra, never a bare ``ModuleNotFoundError``::

    with needs("postgres", "the postgresql:// store"):
        import psycopg
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dibs.exceptions import MissingExtra

__all__ = ["needs"]


@contextmanager
def needs(extra: str, what: str) -> Iterator[None]:
    """Turn the block's ``ImportError`` of a third-party module into :class:`~dibs.MissingExtra`.

    ``what`` says what needs it ("the postgresql:// store"). An error importing
    a module of dibs itself is a bug, not a missing extra, and passes unchanged,
    as does a :class:`~dibs.MissingExtra` raised deeper (it already names its extra).
    """
    try:
        yield
    except MissingExtra:
        raise
    except ImportError as exc:
        # ``name`` is None when a package fails its own import check (psycopg without a
        # libpq it can load): installing the extra is still the cure.
        missing = exc.name or ""
        if missing.partition(".")[0] == "dibs":
            raise
        module = missing.partition(".")[0] or "a dependency"
        raise MissingExtra(
            f"{what} needs {module}, which the {extra!r} extra installs: "
            f"pip install 'dibs[{extra}]' ({exc})",
            extra=extra,
            name=module,
        ) from exc
