"""Store backends, chosen by URL scheme: the built-in table merged with plug-ins.

A scheme maps to ``module:Class``, a :class:`Store` subclass whose
:meth:`Store.from_url` opens it. The built-in stores are listed in
:data:`SCHEMES`; another package adds a store by declaring an entry point in
the ``dibs.stores`` group (see docs/stores.md, "Writing a store of your own")::

    [project.entry-points."dibs.stores"]
    toy = "toy_store:ToyStore"

Built-ins live in a dict here rather than in dibs's own entry points so that a
source checkout on ``PYTHONPATH`` (no installed metadata) still opens them,
and so that no installed package can redirect ``sqlite://`` or
``postgresql://`` to code of its own: a plug-in may add schemes, never replace
one.
"""

from __future__ import annotations

import importlib
import os
import re
from importlib.metadata import EntryPoint, entry_points
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dibs.exceptions import InvalidInput, StoreMisconfigured, UnknownScheme
from dibs.stores.base import Store

__all__ = [
    "DEFAULT_URL",
    "ENTRY_POINT_GROUP",
    "SCHEMES",
    "Store",
    "available_schemes",
    "default_url",
    "open_store",
    "redact",
    "store_class",
]

DEFAULT_URL = "sqlite:///dibs.db"
"""The embedded default: a SQLite file ``dibs.db`` in the working directory."""

ENTRY_POINT_GROUP = "dibs.stores"
"""The entry-point group plug-in stores register under: ``scheme = "module:Class"``."""

SCHEMES: dict[str, str] = {
    "memory": "dibs.stores.memory:MemoryStore",
    "sqlite": "dibs.stores.sqlite:SQLiteStore",
    "postgresql": "dibs.stores.postgres:PostgresStore",
    "postgres": "dibs.stores.postgres:PostgresStore",
    "etcd": "dibs.stores.etcd:EtcdStore",
}
"""The built-in stores: URL scheme → ``module:Class``, imported on first use so extras stay
optional."""


def _plugins() -> dict[str, list[EntryPoint]]:
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name.lower(), []).append(ep)
    return found


def available_schemes() -> dict[str, str]:
    """Every scheme a store URL may use now → ``module:Class``: built-ins, then plug-ins.

    Read afresh on each call, so a package installed while the process runs is
    seen. A plug-in naming a built-in scheme is ignored.
    """
    schemes = dict(SCHEMES)
    for scheme, eps in _plugins().items():
        if scheme not in schemes:
            schemes[scheme] = eps[0].value
    return schemes


def default_url() -> str:
    """The store URL used when none is given: ``$DIBS_URL``, else :data:`DEFAULT_URL`.

    The one place dibs reads ``$DIBS_URL``.
    """
    return os.environ.get("DIBS_URL") or DEFAULT_URL


def _scheme_of(url: object) -> str:
    if not isinstance(url, str) or "://" not in url:
        raise InvalidInput(
            f"store URL must look like 'scheme://...', got {url!r}", field="url", value=url
        )
    # Not urlsplit(): it raises a bare ValueError for a malformed host; the
    # store's from_url() parses the rest and says what is wrong.
    return url.split("://", 1)[0].lower().split("+", 1)[0]


def store_class(url: str) -> type[Store]:
    """The :class:`Store` subclass that handles ``url``'s scheme, imported.

    Raises :class:`~dibs.UnknownScheme` (listing every available scheme, plug-ins
    included) for a scheme nothing handles, and :class:`~dibs.InvalidInput` for
    a malformed URL, two plug-ins claiming one scheme, or an entry point that
    does not name a ``Store`` subclass.
    """
    scheme = _scheme_of(url)
    target = SCHEMES.get(scheme)
    if target is not None:
        module_name, _, class_name = target.partition(":")
        loaded: object = getattr(importlib.import_module(module_name), class_name)
    else:
        eps = _plugins().get(scheme, [])
        if not eps:
            known = sorted(available_schemes())
            raise UnknownScheme(
                f"no store handles URL scheme {scheme!r} in {url!r}; "
                f"known schemes: {', '.join(known)}",
                field="url",
                value=url,
                schemes=tuple(known),
            )
        if len({ep.value for ep in eps}) > 1:
            raise InvalidInput(
                f"several installed packages register the store scheme {scheme!r}: "
                + ", ".join(sorted({ep.value for ep in eps})),
                field="url",
                value=url,
            )
        loaded = eps[0].load()
    if not (isinstance(loaded, type) and issubclass(loaded, Store)):
        raise InvalidInput(
            f"the store registered for {scheme!r} is not a dibs.Store subclass: {loaded!r}",
            field="url",
            value=url,
        )
    return loaded


def open_store(url: str | None = None, *, create: bool = True, **options: Any) -> Store:
    """Open the store named by ``url`` (default ``$DIBS_URL``, else ``sqlite:///dibs.db``).

    Keyword options go to the store's :meth:`~Store.from_url` (``clock=``,
    ``request_retention=`` and backend-specific ones). With ``create=False``
    a store that does not exist yet (see :meth:`Store.exists`) is refused
    with :class:`~dibs.StoreMisconfigured` instead of being created. Raises
    :class:`~dibs.UnknownScheme` for a scheme no store handles,
    :class:`~dibs.InvalidInput` for a malformed URL,
    :class:`~dibs.StoreMisconfigured` for a store that cannot be opened as
    configured and :class:`~dibs.StoreUnavailable` for one that cannot be
    reached now.
    """
    if url is None:
        url = default_url()
    cls = store_class(url)
    if not create and cls.exists(url, **options) is False:
        where = redact(url)
        raise StoreMisconfigured(
            f"no dibs store exists at {where} yet (and create=False makes none)",
            cause="the store does not exist",
        )
    return cls.from_url(url, **options)


_QUERY_PASSWORD = re.compile(r"(?i)((?:^|&)password=)[^&]*")


def redact(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: safe for messages and logs.

    Both places libpq reads one from are hidden: ``user:password@`` and the
    ``password=`` query parameter.
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url.split("://", 1)[0] + "://…"
    if _QUERY_PASSWORD.search(parts.query):  # by hand: urlunsplit drops an empty host
        head, mark, rest = url.partition("?")
        query, hash_, fragment = rest.partition("#")
        url = head + mark + _QUERY_PASSWORD.sub(r"\1***", query) + hash_ + fragment
        parts = urlsplit(url)
    if password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.split(':', 1)[0]}:***@{host}"))
