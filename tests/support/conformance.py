"""Every answer a test gets from the service, checked against the OpenAPI document.

``serve_in_thread`` wraps the app in :class:`Conformance`: it records each
answer (status, media type, body) with the route the router matched, and
:meth:`Conformance.problems` checks them, once the server stopped, against the
document the service itself serves. An answer of a documented status must
have its media type and validate against its schema; any other error must be
a problem document. So a member added to an answer, or a status answered that
the route table does not list, fails the test module that saw it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_MAX_BODY = 1 << 20
_STREAM = "text/event-stream"
# Statuses a route need not document: the framing, router and crash answers of
# every route (each still checked as a problem document).
UNDOCUMENTED_OK = {400, 404, 405, 500, 501, 505}
# What the framing middleware logs when the client left mid-request: nobody reads it.
_CLIENT_LEFT = 499


@dataclass
class Seen:
    method: str
    path: str
    route: str | None
    status: int
    media: str
    body: bytes
    truncated: bool


@dataclass
class Conformance:
    """ASGI middleware: record every answer; :meth:`problems` checks them against the document."""

    app: ASGIApp
    seen: list[Seen] = field(default_factory=list)
    statuses: set[tuple[str, str, int]] = field(default_factory=set)
    """(method, route, status) of every answer seen: what the document was checked on."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status, media, chunks, size, complete = 0, "", [], 0, False

        async def record(message: Message) -> None:
            nonlocal status, media, size, complete
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = dict(message.get("headers", []))
                media = headers.get(b"content-type", b"").decode("latin-1")
            elif message["type"] == "http.response.body" and not media.startswith(_STREAM):
                body = message.get("body", b"")
                if size < _MAX_BODY:
                    chunks.append(body)
                size += len(body)
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                complete = True

        try:
            await self.app(scope, receive, record)
        finally:
            # An answer cut short (the client left) reached nobody whole: not checked.
            if complete:
                self.seen.append(
                    Seen(
                        scope["method"],
                        scope["path"],
                        self._template(scope),
                        status,
                        media,
                        b"".join(chunks),
                        size > _MAX_BODY,
                    )
                )

    def _template(self, scope: Scope) -> str | None:
        endpoint = scope.get("endpoint")
        app = scope.get("app")
        if endpoint is None or app is None:
            return None
        for route in app.router.routes:
            if isinstance(route, Route) and route.endpoint is endpoint:
                return str(route.path)
        return None

    def problems(self, document: dict[str, Any]) -> list[str]:
        """What in the answers seen disagrees with ``document``, one line each."""
        components = document["components"]
        found: list[str] = []
        for seen in self.seen:
            method = seen.method.lower()
            op = document["paths"].get(seen.route or "", {}).get(method)
            where = f"{seen.method} {seen.path} -> {seen.status}"
            if method == "head" or seen.truncated or seen.status == _CLIENT_LEFT:
                continue
            if op is None:
                # A route the document leaves out (/, /docs), or no route at all.
                if seen.status >= 400:
                    found += _check(where, seen, "application/problem+json",
                                    {"$ref": "#/components/schemas/Error"}, components)  # fmt: skip
                continue
            self.statuses.add((method, seen.route or "", seen.status))
            answer = op["responses"].get(str(seen.status))
            if answer is None:
                if seen.status not in UNDOCUMENTED_OK:
                    found.append(f"{where}: status not documented for {seen.route}")
                elif seen.status >= 400:
                    found += _check(where, seen, "application/problem+json",
                                    {"$ref": "#/components/schemas/Error"}, components)  # fmt: skip
                continue
            for media, content in answer.get("content", {}).items():
                found += _check(where, seen, media, content["schema"], components)
        return found


def _check(
    where: str, seen: Seen, media: str, schema: dict[str, Any], components: dict[str, Any]
) -> list[str]:
    if seen.media.split(";")[0].strip() != media:
        return [f"{where}: media type {seen.media!r}, documented {media!r}"]
    if media == _STREAM:
        return []
    if not media.endswith("json"):
        return []
    try:
        value = json.loads(seen.body)
    except ValueError:
        return [f"{where}: the body is not JSON"]
    validator = jsonschema.Draft202012Validator(
        {**schema, "components": components},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    return [f"{where}: {e.message} at {list(e.absolute_path)}" for e in errors[:3]]
