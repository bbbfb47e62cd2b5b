"""uvicorn's h11 protocol, writing each response's head and first body bytes in one send.

uvicorn's h11 cycle writes the status line and headers, then the body, as two
``transport.write`` calls: two ``send`` system calls per response, and on
loopback two wake-ups of the client, which reads the head and then the body.
The send of the head alone was the largest single cost of a claim in the
server's profile (docs/benchmarks.md, "The service"). :class:`H11Protocol`
here holds a final response's head back until the next write (the body's
first bytes, an empty body, or closing the connection) and writes both at
once. Every byte still comes from h11, in the same order: only the number of
writes changes. An interim response (``100 Continue``) is written at once,
since the client waits for it before it sends the body, and so is the head of
a response with no ``Content-Length`` (a stream, such as the seat map's
server-sent events): its first body bytes may be long in coming, and the
client must see the head, and know the stream is open, before then.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol as _Uvicorn

__all__ = ["H11Protocol"]


class _Coalescing:
    """A transport that holds back a response's head until the next write, then writes both."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        # True until the current response's head is written: the next final
        # status line starting a response is the head to hold back.
        self.fresh = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._head is not None:
            data, self._head = self._head + bytes(data), None
        elif not data:  # h11's end of a Content-Length body: nothing to send
            return
        elif self.fresh and data[9:10] != b"1":  # "HTTP/1.1 1xx": interim, write it now
            self.fresh = False
            if b"\r\ncontent-length:" in bytes(data).lower():
                self._head = bytes(data)
                return
            # A stream: its body may come much later, so its head goes now.
        self._transport.write(data)

    def flush(self) -> None:
        """Write a held head now."""
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class H11Protocol(_Uvicorn):
    """uvicorn's h11 protocol on a transport that writes each response's head with its body."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Coalescing(transport))  # type: ignore[arg-type]

    def on_response_complete(self) -> None:
        transport = self.transport
        if isinstance(transport, _Coalescing):
            transport.flush()  # nothing is held once the body is written; never leave a head behind
            transport.fresh = True
        super().on_response_complete()


def protocol(parser: str) -> type[asyncio.Protocol] | str:
    """What ``uvicorn.Config(http=...)`` takes for ``parser``: this h11 protocol for "h11"."""
    return H11Protocol if parser == "h11" else parser
