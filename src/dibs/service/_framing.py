"""HTTP framing rules that the HTTP/1.1 parser leaves to the application (RFC 9110, RFC 9112).

:class:`Framing` is the ASGI middleware in front of every route. Whatever the
server's parser let through, it answers:

==========================================================  ======  ==========
request                                                     status  connection
==========================================================  ======  ==========
HTTP/1.1 without ``Host``, several ``Host`` lines, or a     400     closed
``Host`` that is not ``uri-host [":" port]``
``Transfer-Encoding`` and ``Content-Length`` together       400     closed
a header value with a control character other than HTAB     400     closed
a target neither a path nor an absolute URI (``healthz``)   400     closed
a version ASGI does not know (``HTTP/2.0`` on HTTP/1)       505     closed
request line and headers over 16 KiB                        431     kept
a method this service does not recognize                    501     kept
a ``Content-Encoding`` other than ``identity``              415     kept
==========================================================  ======  ==========

An absolute-form target (``GET http://host/path``), which a server must accept,
is served as its path, with its authority as the Host. On the way out it
closes the connection after a ``408`` or ``413`` (the rest of that body is
never read, so the connection's framing is lost) and after any answer to an
``Expect: 100-continue`` request given before its body was asked for (the
client may send that body or not); it ends a ``HEAD`` response after its
headers, so that a stream (the seat map's server-sent events) cannot keep the
connection busy forever. A client that leaves before its body ends is logged
as ``499``, not as an unhandled error.

Framing that only the parser sees (a body followed by more bytes than its
``Content-Length``, obs-fold, header sizes, pipelining) is the parser's: ``dibs
serve`` runs uvicorn's h11, which answers each request in order and treats
leftover bytes as the next request (docs/service.md, "HTTP framing").
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from urllib.parse import unquote

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dibs.service._guard import ApiError

__all__ = ["KNOWN_METHODS", "MAX_HEAD", "Framing", "valid_host"]

# RFC 9110 section 9, PATCH (RFC 5789) and QUERY (the IETF's safe method with a
# body; OpenAPI 3.2 has it): recognized, so a path that does not allow one
# answers 405 with Allow; any other method is 501 (RFC 9110 9.1). CONNECT is not
# among them: this is no proxy.
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH", "QUERY"}
)

# Host = uri-host [ ":" port ] (RFC 9110 7.2, RFC 3986 3.2.2); a reg-name may be
# empty, and an IP-literal is checked by ipaddress below.
_HOST = re.compile(
    r"(?:\[(?P<literal>[^\]]*)\]"
    r"|(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*)"
    r"(?::[0-9]*)?"
)
_IP_FUTURE = re.compile(r"v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+")
_CLOSE = (b"connection", b"close")
# Header values: any control but HTAB is refused (h11 let them through).
_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# What an ASGI server may put in http_version; h11 also passes HTTP/2.0 and the
# like through from an HTTP/1 request line, which are not HTTP/1 (RFC 9112 2.3).
_VERSION = re.compile(r"1\.[0-9]|2|3")
# The absolute-form of a request target (RFC 9112 3.2.2): a server MUST accept it.
_ABSOLUTE = re.compile(rb"(?i:https?)://([^/?#]*)(/[^?#]*)?")
# h11 refuses a head over 16 KiB only while it is incomplete: one that arrives in
# a single read got through whole. The same bound, then, on every head.
MAX_HEAD = 16 * 1024


def valid_host(value: bytes) -> bool:
    """Whether a ``Host`` field value is ``uri-host [":" port]`` (an empty one is valid)."""
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        return False
    match = _HOST.fullmatch(text)
    if match is None:
        return False
    literal = match.group("literal")
    if literal is None:
        return True
    if _IP_FUTURE.fullmatch(literal):
        return True
    try:
        ipaddress.IPv6Address(literal)
    except ValueError:
        return False
    return "%" not in literal  # a zone ID is not part of a URI's IPv6address


def _problem(scope: Scope) -> ApiError | None:
    """The framing error of this request, or None; one pass over its headers."""
    hosts: list[bytes] = []
    content_length = transfer_encoding = False
    encodings: list[bytes] = []
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    bad_value = False
    for name, value in scope["headers"]:
        size += len(name) + len(value) + 4
        bad_value = bad_value or _CTL.search(value) is not None
        if name == b"host":
            hosts.append(value)
        elif name == b"content-length":
            content_length = True
        elif name == b"transfer-encoding":
            transfer_encoding = True
        elif name == b"content-encoding":
            encodings.append(value)
    version = scope.get("http_version", "1.1")
    if not _VERSION.fullmatch(version):
        return ApiError(505, "http_version_not_supported", f"HTTP/{version} is not supported")
    if bad_value:
        # RFC 9110 5.5: CR, LF and NUL MUST be refused (or replaced); other controls too.
        return ApiError(400, "invalid", "a header value holds a control character")
    # RFC 9112 3.2: a server MUST answer 400 to these.
    if len(hosts) > 1:
        return ApiError(400, "invalid", "send exactly one Host header", {"field": "Host"})
    if not hosts and version.startswith("1.") and version != "1.0":
        return ApiError(
            400, "invalid", "an HTTP/1.1 request needs a Host header", {"field": "Host"}
        )
    if hosts and not valid_host(hosts[0]):
        return ApiError(400, "invalid", "the Host header is not host[:port]", {"field": "Host"})
    # RFC 9112 6.3: a possible smuggling attempt; the connection is closed after it.
    if content_length and transfer_encoding:
        return ApiError(
            400,
            "invalid",
            "send Content-Length or Transfer-Encoding, not both",
            {"field": "Transfer-Encoding"},
        )
    if size > MAX_HEAD:
        return ApiError(
            431, "too_large", f"the request line and headers are limited to {MAX_HEAD} bytes"
        )
    if scope["method"] not in KNOWN_METHODS:
        return ApiError(501, "not_implemented", f"method {scope['method']!r} is not implemented")
    codings = [c.strip().lower() for v in encodings for c in v.split(b",")]
    if any(c not in (b"", b"identity") for c in codings):
        # RFC 9110 15.5.16: Accept-Encoding tells an unsupported coding from a media type.
        return ApiError(
            415,
            "unsupported_media_type",
            "this service decodes no Content-Encoding: send the body as it is",
            {"field": "Content-Encoding"},
            headers={"Accept-Encoding": "identity"},
        )
    return None


def _origin_form(scope: Scope) -> Scope | ApiError:
    """The scope with an absolute-form target made a path (and its authority the Host).

    uvicorn's h11 passes ``http://host/path`` through as the path; a target that
    is neither a path nor absolute (``healthz``, ``*``) is 400.
    """
    root = scope.get("root_path", "").encode("latin-1")
    raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
    target = raw[len(root) :] if root and raw.startswith(root) else raw
    if target.startswith(b"/"):
        return scope
    match = _ABSOLUTE.fullmatch(target)
    if match is None or not valid_host(match.group(1)):
        return ApiError(400, "invalid", "the request target must be a path or an absolute URI")
    path = match.group(2) or b"/"
    headers = [(k, v) for k, v in scope["headers"] if k != b"host"]
    return {
        **scope,
        "raw_path": root + path,
        "path": scope.get("root_path", "") + unquote(path.decode("latin-1")),
        "headers": [(b"host", match.group(1)), *headers],
    }


class Framing:
    """Refuse badly framed requests and keep every connection's framing sound (module doc).

    ``render`` turns an :class:`ApiError` (and the request's scope) into the
    response the API gives for it.
    """

    def __init__(self, app: ASGIApp, render: Callable[[ApiError, Scope], Response]) -> None:
        self.app = app
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = _problem(scope)
        if problem is None:
            checked = _origin_form(scope)
            if isinstance(checked, ApiError):
                problem = checked
            else:
                scope = checked
        # A client that sent "Expect: 100-continue" and gets a final answer before
        # the body was asked for may send it or not (RFC 9110 10.1.1): what
        # follows on the connection is ambiguous, so it is closed.
        expects = any(k == b"expect" and v.lower() == b"100-continue" for k, v in scope["headers"])
        if problem is not None:
            if problem.status in (400, 505) or expects:
                # The message's framing is in doubt: nothing after it is a request.
                problem.headers = {**problem.headers, "Connection": "close"}
            await self.render(problem, scope)(scope, receive, send)
            return
        if scope["method"] == "HEAD":
            await self._head(scope, receive, send)
            return

        started = asked = False

        async def receive_body() -> Message:
            nonlocal asked
            asked = True
            return await receive()

        async def send_closing(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] in (408, 413) or (expects and not asked):
                    # The body was not read to its end: what follows it on the
                    # connection is not a request (RFC 9110 15.5.9, 15.5.14).
                    message["headers"] = [*message.get("headers", ()), _CLOSE]
            await send(message)

        try:
            await self.app(scope, receive_body if expects else receive, send_closing)
        except ClientDisconnect:
            # The client closed before its body ended: nobody to answer, and no
            # internal error. 499 (nginx's "client closed request") is what the
            # access log and metrics record; the server writes nothing.
            if not started:
                await send({"type": "http.response.start", "status": 499, "headers": []})

    async def _head(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run a HEAD request, ending its response with its headers (RFC 9110 9.3.2).

        Once the headers are out, the app's receive answers ``http.disconnect``,
        which stops a streaming response; its body is dropped.
        """
        done = False

        async def head_send(message: Message) -> None:
            nonlocal done
            if done:
                return
            await send(message)
            if message["type"] == "http.response.start":
                done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def head_receive() -> Message:
            if done:
                return {"type": "http.disconnect"}
            return await receive()

        await self.app(scope, head_receive, head_send)
