"""The ASGI application: routes, the access-log middleware, and the background jobs.

``create_app`` wires a store, a key ring and a :class:`ServiceConfig` into a
Starlette app. Every store call (claims, lots, match, the seat maps and their
change feed, the claim-ID secret, the sweeper) awaits one async store
(:mod:`dibs.service._stores` says which). Background jobs run on the app's
event loop while it is up (the lifespan): the sweeper, every
``sweep_interval`` seconds with jitter, and one poll loop per showing for the
live seat map.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dibs._model import Target, Unit
from dibs.aio import AsyncStore, ThreadedStore
from dibs.exceptions import DibsError
from dibs.service._api import Api
from dibs.service._board import Board
from dibs.service._config import ServiceConfig
from dibs.service._framing import Framing
from dibs.service._guard import PROBLEM_JSON, ApiError, new_request_id
from dibs.service._keys import KeyRing
from dibs.service._limits import Limits
from dibs.service._metrics import Metrics
from dibs.service._openapi import openapi_document, render_docs
from dibs.service._page import seat_map_page
from dibs.service._patterns import Patterns
from dibs.service._routes import operations
from dibs.service._stores import SharedFace, open_async
from dibs.service._waitlists import Waitlists
from dibs.service._wire import RESERVED
from dibs.stores.base import Store

__all__ = ["Service", "create_app"]

log = logging.getLogger("dibs.service")
access_log = logging.getLogger("dibs.service.access")


class Service:
    """One running instance: its async store, keys, metrics, seat-map boards and the API handlers.

    Every store call awaits ``aio``. Without ``aio``, the sync ``store`` is
    wrapped once in a :class:`~dibs.service._stores.SharedFace` for it.
    """

    def __init__(
        self,
        config: ServiceConfig,
        store: Store | None,
        keys: KeyRing,
        aio: AsyncStore | None = None,
    ) -> None:
        if aio is None:
            if store is None:
                raise TypeError("Service needs a store: store= (sync) or aio= (async)")
            aio = SharedFace(store, threads=config.threads)
        self.config = config
        self.aio = aio
        self._given = store
        self.keys = keys
        self.metrics = Metrics(aio.scheme)
        self.change_feed = feed = aio.change_feed()
        self.boards = {
            s.slot: Board(aio, s, poll_interval=config.poll_interval, change_feed=feed)
            for s in config.showings
        }
        self.api = Api(aio, keys, config, self.metrics, self.changed)
        self.patterns = Patterns(self.api, config.lots)
        self.limits = Limits(self.api)
        self.waitlists = Waitlists(self.api, feed)
        self.ready = False

    @property
    def store(self) -> Store | None:
        """The sync store given, else the one behind ``aio`` if it runs on one (memory://, SQLite).

        None on a native async store (PostgreSQL, etcd). For code outside the
        event loop, such as tests: the service itself never calls it.
        """
        if self._given is not None:
            return self._given
        return self.aio.sync if isinstance(self.aio, ThreadedStore) else None

    def changed(self, targets: tuple[Target, ...]) -> None:
        """Tell the boards whose showing these targets are in to refresh now."""
        for target in targets:
            if isinstance(target, Unit) and target.slot in self.boards:
                self.boards[target.slot].poke()

    async def sweep_forever(self) -> None:
        """Sweep the store every ``sweep_interval`` seconds (±10 % jitter, so instances spread)."""
        while True:
            await asyncio.sleep(self.config.sweep_interval * random.uniform(0.9, 1.1))
            await self.sweep_once()

    async def sweep_once(self) -> None:
        """One sweep; failures are logged and retried on the next round."""
        started = time.perf_counter()
        try:
            result = await self.aio.sweep()
        except Exception:
            log.exception("sweep failed")
            return
        finally:
            self.metrics.observe_store("sweep", time.perf_counter() - started)
        self.metrics.holds_expired.inc(result.expired)
        if result.expired:
            for board in self.boards.values():
                board.poke()
        log.info(
            "swept",
            extra={
                "expired": result.expired,
                "purged_requests": result.purged_requests,
                "purged_claims": result.purged_claims,
            },
        )

    # --- routes outside /v1 -----------------------------------------------------------------------

    async def showings(self, request: Request) -> Response:
        """``GET /v1/showings``: the showings this instance draws seat maps for."""
        self._map_access(request)
        return JSONResponse(
            {
                "showings": [
                    {"slot": b.showing.slot, "rows": b.showing.rows, "cols": b.showing.cols}
                    for b in self.boards.values()
                ]
            }
        )

    def _board(self, request: Request) -> Board:
        self._map_access(request)
        board = self.boards.get(request.path_params["slot"])
        if board is None:
            raise ApiError(404, "not_found", "no such showing")
        return board

    def _map_access(self, request: Request) -> None:
        if not self.config.public_map:
            self.api.authorize(request)

    async def showing(self, request: Request) -> Response:
        """``GET /v1/showings/{slot}``: every seat's state now, a snapshot."""
        board = self._board(request)
        snapshot = await self.api.call("seat_map", board.compute())
        snapshot["version"] = board.version
        return JSONResponse(snapshot)

    async def events(self, request: Request) -> Response:
        """``GET /v1/showings/{slot}/events``: the seat map as server-sent events."""
        board = self._board(request)

        async def stream() -> AsyncIterator[str]:
            board.subscribers += 1
            try:
                if board.snapshot is None or board.subscribers == 1:
                    await board.refresh()
                version = -1
                while True:
                    if board.version != version and board.snapshot is not None:
                        version = board.version
                        data = json.dumps(board.snapshot, separators=(",", ":"))
                        yield f"event: seats\nid: {version}\ndata: {data}\n\n"
                    elif not await board.changed(version, 15.0):
                        yield ": keep-alive\n\n"
            finally:
                board.subscribers -= 1

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def health(self, request: Request) -> Response:
        """``GET /healthz``: the process answers."""
        return JSONResponse({"status": "ok"})

    async def readiness(self, request: Request) -> Response:
        """``GET /readyz``: the store answers a read within the request timeout."""
        probe = Unit(f"{RESERVED}readiness-probe", "")
        try:
            await self.api.call("ready", self.aio.holder_of(probe))
        except ApiError as exc:
            return exc.response(request.scope.get("root_path", ""))
        return JSONResponse({"status": "ready", "store": self.aio.scheme})

    async def metrics_page(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text format."""
        return Response(
            self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    async def page(self, request: Request) -> Response:
        """``GET /``: the live seat map of the first (or ``?show=``) showing."""
        slot = request.query_params.get("show") or self.config.showings[0].slot
        if slot not in self.boards:
            slot = self.config.showings[0].slot
        return HTMLResponse(seat_map_page(slot, [s.slot for s in self.config.showings]))

    def document(self) -> dict[str, Any]:
        """This instance's OpenAPI document: its limits, and its lots and showings as examples."""
        return openapi_document(
            self.config.max_targets,
            tuple(lot.name for lot in self.config.lots),
            tuple(showing.slot for showing in self.config.showings),
        )

    async def openapi(self, request: Request) -> Response:
        """``GET /openapi.json``."""
        return JSONResponse(self.document())

    async def docs(self, request: Request) -> Response:
        """``GET /docs``: the OpenAPI document rendered as one self-contained page."""
        return HTMLResponse(render_docs(self.document()))


def create_app(
    config: ServiceConfig | None = None,
    *,
    store: Store | None = None,
    async_store: AsyncStore | None = None,
    keys: KeyRing | None = None,
) -> Starlette:
    """Build the service's ASGI app: every store call awaits one async store.

    By default the app opens ``dibs.aio.open(config.store_url)`` at startup
    (the lifespan) and closes it at shutdown; a store that cannot open fails
    the startup. A sync ``store`` passed in is wrapped once on an async face
    (:meth:`dibs.aio.ThreadedStore.over`); an ``async_store`` is used as it is
    (given both, ``store`` is the same claims' sync face, for the caller's
    own use). Stores passed in are not closed by the app. ``keys`` defaults to
    the config's keys file. Raises :class:`~dibs.UnknownScheme` and
    :class:`~dibs.InvalidInput` for a malformed store URL.
    """
    config = config or ServiceConfig()
    own_store = store is None and async_store is None
    if async_store is not None:
        aio = async_store
    elif store is not None:
        aio = SharedFace(store, threads=config.threads)
    else:
        aio = open_async(config.store_url, threads=config.threads)
    service = Service(config, store, keys or KeyRing(config.keys_file), aio)
    api = service.api

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            # Connect now rather than on the first request.
            await aio.open()
        except DibsError:
            if own_store:  # as dibs.open() of it would have: the app cannot serve
                await aio.close()
                raise
            # A store passed in that cannot be reached yet is retried by the
            # first call (and /readyz says so).
            log.exception("the async store did not open; the first request retries")
        try:
            await api.load_ids()
        except ApiError:
            log.exception("the claim-ID secret was not read; the first request retries")
        jobs = [asyncio.create_task(service.sweep_forever())]
        jobs += [asyncio.create_task(board.run()) for board in service.boards.values()]
        jobs.append(asyncio.create_task(service.waitlists.run()))
        service.ready = True
        log.info("serving", extra={"store": aio.scheme})
        try:
            yield
        finally:
            for job in jobs:
                job.cancel()
            for job in jobs:
                with contextlib.suppress(asyncio.CancelledError):
                    await job
            await service.waitlists.close()
            if service.change_feed is not None:
                await service.change_feed.close()
            if async_store is None:  # the face or the store the app made
                await aio.close()

    routes = _routes(service)

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response(request.scope.get("root_path", ""))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        if exc.status_code >= 500:  # Starlette raises none today; never let one pass as ours
            error = "internal"
        problem = ApiError(exc.status_code, error, str(exc.detail), headers=dict(exc.headers or {}))
        return problem.response(request.scope.get("root_path", ""))

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: api_error, HTTPException: http_error},
    )
    # A path that matches no route answers a JSON 404, never a redirect to
    # another path (/v1/claims/%2f used to answer 307).
    app.router.redirect_slashes = False
    app.state.service = service
    # Framing runs inside AccessLog, so that the requests it refuses are logged and counted.
    app.add_middleware(Framing, render=error_response)
    app.add_middleware(AccessLog, service=service)
    return app


def error_response(exc: ApiError, scope: Scope) -> Response:
    """The framing middleware's answer for an :class:`ApiError`: the handlers' own."""
    return exc.response(scope.get("root_path", ""))


def _routes(service: Service) -> list[Route]:
    """The app's routes, in the route table's order (the claim path's first)."""
    owners = {
        "service": service,
        "api": service.api,
        "patterns": service.patterns,
        "limits": service.limits,
        "waitlists": service.waitlists,
    }
    paths: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
    for op in operations(service.config.max_targets):
        owner, _, name = op.handler.partition(".")
        paths.setdefault(op.path, {})[op.method] = getattr(owners[owner], name)
    return [
        _route(path, **handlers)
        if len(handlers) > 1
        else Route(path, *handlers.values(), methods=list(handlers))
        for path, handlers in paths.items()
    ]


def _route(path: str, **handlers: Callable[[Request], Awaitable[Response]]) -> Route:
    """One route for every method of a path, so that a 405 lists them all in ``Allow``."""
    if "GET" in handlers:
        handlers["HEAD"] = handlers["GET"]

    async def endpoint(request: Request) -> Response:
        return await handlers[request.method](request)

    return Route(path, endpoint, methods=list(handlers))


class AccessLog:
    """Give every request an ID (``X-Request-ID``), log it as one JSON line, count it.

    Also turns an unexpected exception into a JSON 500 that carries the request ID.
    """

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app = app
        self.service = service
        self._paths: dict[object, str] = {}

    def _route(self, scope: Scope) -> str:
        """The matched route's path template (the router left its endpoint in the scope)."""
        if not self._paths:
            routes = scope["app"].router.routes
            self._paths = {r.endpoint: r.path for r in routes if isinstance(r, Route)}
        return self._paths.get(scope.get("endpoint"), "unmatched")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = new_request_id(None if raw is None else raw.decode("latin-1"))
        scope["dibs.request_id"] = request_id
        started = time.perf_counter()
        status = 500
        sent = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                sent = True
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (b"x-request-id", request_id.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception:
            log.exception("unhandled error", extra={"request_id": request_id})
            if not sent:
                problem = ApiError(500, "internal", "internal error", {"request_id": request_id})
                body = json.dumps(problem.body(scope.get("root_path", ""))).encode()
                await send_wrapper(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [
                            (b"content-type", PROBLEM_JSON.encode()),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
        finally:
            seconds = time.perf_counter() - started
            route = self._route(scope)
            metrics = self.service.metrics
            metrics.observe_http(route, status, seconds)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(
                    "request",
                    extra={
                        "request_id": request_id,
                        "method": scope["method"],
                        "path": scope["path"],
                        "route": route,
                        "status": status,
                        "ms": round(seconds * 1000, 3),
                        "holder": scope.get("dibs.holder"),
                    },
                )
