"""``dibs serve``: the HTTP API, the live seat map and API keys (the ``dibs[service]`` extra).

>>> from dibs.service import ServiceConfig, create_app
>>> app = create_app(ServiceConfig(store_url="memory://", keys_file=None))

``create_app`` returns a Starlette (ASGI) app; ``dibs serve`` runs it on uvicorn.
See docs/service.md. Names are imported on first use, so that ``dibs`` (and its
``serve``/``keys`` commands' argument parsing) works without the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dibs._extras import needs

if TYPE_CHECKING:
    from dibs.service._app import Service, create_app
    from dibs.service._config import ServiceConfig, Showing
    from dibs.service._keys import ApiKey, KeyRing

__all__ = ["ApiKey", "KeyRing", "Service", "ServiceConfig", "Showing", "create_app"]

_WHERE = {
    "ApiKey": "_keys",
    "KeyRing": "_keys",
    "Service": "_app",
    "ServiceConfig": "_config",
    "Showing": "_config",
    "create_app": "_app",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        with needs("service", f"dibs.service.{name}"):
            return getattr(importlib.import_module(f"dibs.service.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'dibs.service' has no attribute {name!r}")
