"""dibs serve's h11 protocol writes each final response's head and body in one write.

dibs.service._http11 changes only how many writes a response takes: every
byte still comes from h11, in order. Here the protocol runs on a transport
that records each write, under a small ASGI app.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from dibs.service._http11 import H11Protocol

QUICK = True


class Recorder(asyncio.Transport):
    """A transport that keeps every write and never blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status = 204 if scope["path"] == "/empty" else 200
    length = b"0" if status == 204 else str(len(body) + 3).encode()
    headers = [(b"content-length", length)]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if status == 204:
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.body", "body": b"ok:", "more_body": True})
    await send({"type": "http.response.body", "body": body})


async def exchange(*requests: bytes, settle: int = 50) -> Recorder:
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
    config.load()
    protocol = H11Protocol(config, ServerState(), app_state={})
    transport = Recorder()
    protocol.connection_made(transport)
    for request in requests:
        protocol.data_received(request)
        for _ in range(settle):
            await asyncio.sleep(0)
    protocol.connection_lost(None)
    return transport


def test_a_response_head_goes_out_with_its_first_body_bytes() -> None:
    transport = asyncio.run(exchange(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi"))
    assert len(transport.writes) == 2, transport.writes  # head + "ok:", then "hi"
    head, body = transport.writes
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\nok:"), head
    assert body == b"hi"


def test_pipelined_responses_each_go_out_whole_and_in_order() -> None:
    one = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n1"
    two = b"GET /empty HTTP/1.1\r\nHost: a\r\n\r\n"
    transport = asyncio.run(exchange(one + two + one))
    joined = b"".join(transport.writes)
    assert joined.count(b"HTTP/1.1 200 ") == 2 and joined.count(b"HTTP/1.1 204 ") == 1
    assert joined.index(b"HTTP/1.1 204 ") < joined.rindex(b"HTTP/1.1 200 ")
    # An empty body still flushes its head: no response is left behind.
    assert any(w.startswith(b"HTTP/1.1 204 ") for w in transport.writes), transport.writes
    assert joined.endswith(b"ok:1")


def test_100_continue_goes_out_before_the_body_is_sent() -> None:
    async def run() -> Recorder:
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
        config.load()
        protocol = H11Protocol(config, ServerState(), app_state={})
        transport = Recorder()
        protocol.connection_made(transport)
        protocol.data_received(
            b"POST /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
        )
        for _ in range(50):
            await asyncio.sleep(0)
        # The client waits for the 100 before it sends the body: it must be out now.
        assert transport.writes and transport.writes[0].startswith(b"HTTP/1.1 100 "), (
            transport.writes
        )
        protocol.data_received(b"hi")
        for _ in range(50):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return transport

    transport = asyncio.run(run())
    assert transport.writes[1].startswith(b"HTTP/1.1 200 ") and transport.writes[1].endswith(b"ok:")


@pytest.mark.parametrize(
    "request_bytes", [b"GET / HTTP/1.1\r\n\r\n", b"BAD\x00 / HTTP/1.1\r\n\r\n"]
)
def test_a_refused_request_is_answered_whole_before_the_close(request_bytes: bytes) -> None:
    transport = asyncio.run(exchange(request_bytes))
    joined = b"".join(transport.writes)
    assert joined.startswith(b"HTTP/1.1 400 "), joined
    assert transport.closed


def test_a_stream_head_goes_out_before_its_first_body_bytes() -> None:
    """A response with no Content-Length (server-sent events) may idle before its body.

    Its head must not wait for the body: a client must learn at once that the
    stream is open (an EventSource fires ``open`` on the head alone).
    """

    async def run() -> tuple[list[bytes], Recorder]:
        go = asyncio.Event()

        async def stream(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await receive()
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await go.wait()
            await send({"type": "http.response.body", "body": b"data: 1\n\n"})

        config = uvicorn.Config(stream, log_config=None, access_log=False, lifespan="off")
        config.load()
        protocol = H11Protocol(config, ServerState(), app_state={})
        transport = Recorder()
        protocol.connection_made(transport)
        protocol.data_received(b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
        for _ in range(50):
            await asyncio.sleep(0)
        before = list(transport.writes)
        go.set()
        for _ in range(50):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return before, transport

    before, transport = asyncio.run(run())
    assert len(before) == 1 and before[0].startswith(b"HTTP/1.1 200 "), before
    assert before[0].endswith(b"\r\n\r\n"), before  # the head alone, whole
    assert b"data: 1" in b"".join(transport.writes[1:]), transport.writes
