"""``dibs serve``: the HTTP API, the live seat map and API keys (the ``dibs[service]`` extra).

>>> from dibs.service import ServiceConfig, create_app
>>> app = create_app(ServiceConfig(store_url="memory://", keys_file=None))

``create_app`` returns a Starlette (ASGI) app; ``dibs serve`` runs it on uvicorn.
See docs/service.md.
"""

from dibs.service._app import Service, create_app
from dibs.service._config import ServiceConfig, Showing
from dibs.service._keys import ApiKey, KeyRing

__all__ = ["ApiKey", "KeyRing", "Service", "ServiceConfig", "Showing", "create_app"]
