"""HTTP framing on the wire (RFC 9110, RFC 9112): raw bytes over a socket to a real uvicorn.

Issue 24, item 14, and the sweep after it. Rules the service's middleware
enforces (``dibs.service._framing``) are checked on both of uvicorn's parsers,
so that the app stays sound when embedded on httptools; rules that only the
parser can see are checked on h11, the parser ``dibs serve`` runs, and once
through ``python -m dibs.service serve`` itself.
"""

from __future__ import annotations

import json
import socket
import string
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dibs
from dibs.service import ServiceConfig
from dibs.service._framing import MAX_HEAD, valid_host
from service_support import Running, serve_in_process, serve_in_thread

pytestmark = pytest.mark.timeout(90)

Parser = Literal["h11", "httptools"]
PARSERS: tuple[Parser, ...] = ("h11", "httptools")


@dataclass
class Answer:
    status: int
    headers: dict[str, list[str]] = field(default_factory=dict)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return None if not values else ", ".join(values)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def closes(self) -> bool:
        return "close" in (self.header("connection") or "").lower()


_OPEN: list[Wire] = []


@pytest.fixture(autouse=True)
def _close_wires() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


class Wire:
    """One TCP connection: write raw bytes, read HTTP/1.1 responses one by one."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buffer = b""
        _OPEN.append(self)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _more(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("the server closed the connection")
        return chunk

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            self.buffer += self._more()
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def _exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += self._more()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def answer(self, *, head: bool = False) -> Answer:
        """The next response (its body unread for a HEAD); EOFError if the connection closed."""
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        answer = Answer(int(lines[0].split(" ")[1]))
        for line in lines[1:]:
            name, _, value = line.partition(":")
            answer.headers.setdefault(name.strip().lower(), []).append(value.strip())
        if head or answer.status in (204, 304) or answer.status < 200:
            return answer
        if (answer.header("transfer-encoding") or "").lower() == "chunked":
            while size := int(self._until(b"\r\n").split(b";")[0], 16):
                answer.body += self._exactly(size)
                self._exactly(2)
            self._until(b"\r\n")
        elif answer.header("content-length") is not None:
            answer.body = self._exactly(int(answer.header("content-length") or 0))
        else:
            while True:
                try:
                    self.buffer += self._more()
                except EOFError:
                    break
            answer.body, self.buffer = self.buffer, b""
        return answer

    def closed(self) -> bool:
        """Whether the server closes the connection with nothing more to say."""
        try:
            extra = self.buffer or self._more()
        except EOFError:
            return True
        except ConnectionResetError:
            return True
        raise AssertionError(f"the connection said more: {extra[:200]!r}")

    def close(self) -> None:
        self.sock.close()


@dataclass
class Served:
    running: Running
    port: int
    store: dibs.Store | None = None

    def wire(self) -> Wire:
        return Wire(self.port)

    def auth(self, holder: str = "alice") -> bytes:
        return f"Authorization: Bearer {self.running.token(holder)}\r\n".encode()


@pytest.fixture(scope="module", params=PARSERS)
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    parser: Parser = request.param
    config = ServiceConfig(store_url="memory://", keys_file=None, body_timeout=2.0, max_body=1024)
    with (
        dibs.open("memory://") as store,
        serve_in_thread(config, store=store, http=parser) as running,
    ):
        yield Served(running, int(running.url.rsplit(":", 1)[1]), store)


@pytest.fixture(scope="module")
def h11(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The service on the parser ``dibs serve`` runs."""
    config = ServiceConfig(store_url="memory://", keys_file=None, max_body=1024)
    with dibs.open("memory://") as store, serve_in_thread(config, store=store) as running:
        yield Served(running, int(running.url.rsplit(":", 1)[1]), store)


def claim_request(served: Served, resource: str, *, extra: bytes = b"", body: bytes | None = None,
                  length: int | None = None) -> bytes:  # fmt: skip
    raw = (
        body
        if body is not None
        else json.dumps({"targets": [{"resource": resource, "slot": ""}], "ttl": 60}).encode()
    )
    n = len(raw) if length is None else length
    return (
        b"POST /v1/claims HTTP/1.1\r\nHost: 127.0.0.1\r\n" + served.auth()
        + b"Content-Type: application/json\r\n" + extra
        + f"Content-Length: {n}\r\n\r\n".encode() + raw
    )  # fmt: skip


def held(served: Served, resource: str) -> bool:
    assert served.store is not None
    return served.store.holder_of(dibs.Unit(resource, "")) is not None


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def assert_usable(wire: Wire) -> None:
    """The connection still frames requests: a next one on it is answered."""
    wire.send(HEALTHZ)
    answer = wire.answer()
    assert answer.status == 200 and answer.json() == {"status": "ok"}


# --- Host (RFC 9112 3.2) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        b"",  # missing
        b"Host: 127.0.0.1\r\nHost: 127.0.0.1\r\n",  # duplicate, even when equal
        b"Host: a\r\nHost: b\r\n",
        b"Host: a b\r\n",
        b"Host: a/b\r\n",
        b"Host: user@example.com\r\n",
        b"Host: [::1\r\n",
        b"Host: [not-an-ip]:80\r\n",
        b"Host: example.com:80a\r\n",
        b"Host: \xc3\xa9.example\r\n",
    ],
)
def test_a_missing_duplicate_or_invalid_host_is_400(served: Served, headers: bytes) -> None:
    wire = served.wire()
    wire.send(b"GET /healthz HTTP/1.1\r\n" + headers + b"\r\n")
    answer = wire.answer()
    assert answer.status == 400, answer
    assert answer.closes
    assert wire.closed()


@pytest.mark.parametrize(
    "host",
    [b"127.0.0.1:8000", b"[::1]:8000", b"example.com", b"", b"xn--bcher-kva.example:", b"[v1.x]"],
)
def test_a_valid_host_is_served_and_http_10_needs_none(served: Served, host: bytes) -> None:
    wire = served.wire()
    wire.send(b"GET /healthz HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    assert wire.answer().status == 200
    assert_usable(wire)
    wire = served.wire()
    wire.send(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert wire.answer().status == 200


_REG_NAME = string.ascii_letters + string.digits + "-._~!$&'()*+,;="


@given(
    st.one_of(
        st.text(alphabet=_REG_NAME, max_size=40),
        st.ip_addresses(v=4).map(str),
        st.ip_addresses(v=6).map(lambda ip: f"[{ip}]"),
    ),
    st.one_of(st.none(), st.text(alphabet=string.digits, max_size=6)),
)
def test_every_uri_host_with_a_port_is_a_valid_host(host: str, port: str | None) -> None:
    value = host if port is None else f"{host}:{port}"
    assert valid_host(value.encode())


@given(
    st.text(alphabet=_REG_NAME, max_size=10),
    st.characters().filter(lambda c: c not in _REG_NAME + ":[]%"),
    st.text(max_size=10),
)
def test_a_host_with_a_character_outside_uri_host_is_invalid(
    before: str, bad: str, after: str
) -> None:
    assert not valid_host((before + bad + after).encode("utf-8", "surrogatepass"))


# --- HEAD on the event stream ------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [b"/v1/showings/show-1/events", b"/v1/showings/show-1", b"/healthz"]
)
def test_head_ends_after_the_headers_and_the_connection_stays_usable(
    served: Served, path: bytes
) -> None:
    wire = served.wire()
    wire.send(b"HEAD " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = wire.answer(head=True)
    assert answer.status == 200
    if path.endswith(b"events"):
        assert (answer.header("content-type") or "").startswith("text/event-stream")
    assert_usable(wire)  # no body bytes came before this answer, or it would not parse


def test_head_and_a_next_request_pipelined_together(served: Served) -> None:
    wire = served.wire()
    wire.send(b"HEAD /v1/showings/show-1/events HTTP/1.1\r\nHost: x\r\n\r\n" + HEALTHZ)
    assert wire.answer(head=True).status == 200
    assert wire.answer().json() == {"status": "ok"}


# --- a body shorter than the bytes sent --------------------------------------------------------


def test_bytes_after_a_complete_body_never_cost_the_claims_answer(h11: Served) -> None:
    # The body is a whole JSON object; what follows its Content-Length is a next
    # (malformed) request. The claim is made and answered first; then the
    # leftover gets its own 400, or the connection closes.
    resource = f"leftover-{uuid.uuid4()}"
    wire = h11.wire()
    wire.send(claim_request(h11, resource) + b"garbage\r\n\r\n")
    first = wire.answer()
    assert first.status == 201, first
    assert first.json()["targets"] == [{"resource": resource, "slot": ""}]
    assert held(h11, resource)
    try:
        second = wire.answer()
    except (EOFError, ConnectionResetError):
        return
    assert second.status == 400 and second.closes
    assert wire.closed()


def test_a_body_cut_short_by_its_content_length_makes_no_claim(h11: Served) -> None:
    # Content-Length counted characters, not UTF-8 bytes: the body ends early.
    resource = f"é-short-{uuid.uuid4()}"
    text = json.dumps({"targets": [{"resource": resource, "slot": ""}]}, ensure_ascii=False)
    wire = h11.wire()
    wire.send(claim_request(h11, resource, body=text.encode(), length=len(text)) + b"\r\n\r\n")
    first = wire.answer()
    assert first.status == 400 and first.json()["field"] == "body", first
    assert not held(h11, resource)
    try:
        second = wire.answer()
    except (EOFError, ConnectionResetError):
        return
    assert second.status == 400
    assert wire.closed()


def test_pipelined_claims_are_each_answered_in_order(served: Served) -> None:
    resources = [f"pipe-{i}-{uuid.uuid4()}" for i in range(4)]
    wire = served.wire()
    wire.send(b"".join(claim_request(served, r) for r in resources) + HEALTHZ)
    for r in resources:
        answer = wire.answer()
        assert answer.status == 201 and answer.json()["targets"][0]["resource"] == r
    assert wire.answer().json() == {"status": "ok"}


def test_dibs_serve_answers_a_claim_before_its_leftover_bytes(tmp_path: Path) -> None:
    with serve_in_process("memory://", tmp_path / "keys.json") as running:
        port = int(running.url.rsplit(":", 1)[1])
        served = Served(running, port)
        resource = f"serve-{uuid.uuid4()}"
        wire = served.wire()
        wire.send(claim_request(served, resource) + b"garbage\r\n\r\n")
        first = wire.answer()
        assert first.status == 201, first
        assert first.json()["targets"] == [{"resource": resource, "slot": ""}]


# --- methods -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", [b"PROPFIND", b"PURGE", b"LINK"])
def test_a_method_the_service_does_not_recognize_is_501(served: Served, method: bytes) -> None:
    wire = served.wire()
    wire.send(method + b" /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    answer = wire.answer()
    assert answer.status == 501 and answer.json()["error"] == "not_implemented", answer
    assert_usable(wire)


@pytest.mark.parametrize("method", [b"FOO", b"get", b"BREW"])
def test_any_unknown_token_is_501_on_dibs_serves_parser(h11: Served, method: bytes) -> None:
    wire = h11.wire()
    wire.send(method + b" /v1/claims HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = wire.answer()
    assert answer.status == 501, answer
    assert_usable(wire)


@pytest.mark.parametrize(
    ("method", "path"),
    [(b"PUT", b"/healthz"), (b"PATCH", b"/v1/claims"), (b"POST", b"/healthz"),
     (b"OPTIONS", b"/v1/claims"), (b"DELETE", b"/v1/claims"), (b"QUERY", b"/v1/claims")],
)  # fmt: skip
def test_a_known_method_a_route_does_not_allow_stays_405(
    served: Served, method: bytes, path: bytes
) -> None:
    wire = served.wire()
    wire.send(method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    answer = wire.answer()
    assert answer.status == 405 and answer.header("allow"), answer
    assert_usable(wire)


# --- 408 and 413 close the connection ----------------------------------------------------------


def test_a_slow_body_is_408_and_closes_the_connection(served: Served) -> None:
    resource = f"slow-{uuid.uuid4()}"
    request = claim_request(served, resource)
    wire = served.wire()
    wire.send(request[:-5])  # the last bytes never come
    answer = wire.answer()
    assert answer.status == 408 and answer.json()["error"] == "timeout", answer
    assert answer.closes
    assert wire.closed()
    assert not held(served, resource)


def test_a_body_over_the_limit_is_413_and_closes_the_connection(served: Served) -> None:
    wire = served.wire()
    head = claim_request(served, "big", body=b"", length=10**9)
    wire.send(head + b"{" * 2048)
    answer = wire.answer()
    assert answer.status == 413 and answer.closes, answer
    assert wire.closed()


# --- Content-Encoding --------------------------------------------------------------------------


@pytest.mark.parametrize("coding", [b"gzip", b"br", b"identity, gzip", b"x-custom"])
def test_a_content_encoding_the_service_does_not_decode_is_415(
    served: Served, coding: bytes
) -> None:
    resource = f"enc-{uuid.uuid4()}"
    wire = served.wire()
    wire.send(claim_request(served, resource, extra=b"Content-Encoding: " + coding + b"\r\n"))
    answer = wire.answer()
    assert answer.status == 415, answer
    assert answer.header("accept-encoding") == "identity"
    assert answer.json()["field"] == "Content-Encoding"
    assert not held(served, resource)
    assert_usable(wire)


def test_content_encoding_identity_is_the_body_as_it_is(served: Served) -> None:
    resource = f"identity-{uuid.uuid4()}"
    wire = served.wire()
    wire.send(claim_request(served, resource, extra=b"Content-Encoding: identity\r\n"))
    assert wire.answer().status == 201


# --- the sweep: other framing edge cases -------------------------------------------------------


def test_transfer_encoding_with_content_length_is_400_and_closes(served: Served) -> None:
    # RFC 9112 6.3: a request smuggling vector; the connection must close after it.
    resource = f"smuggle-{uuid.uuid4()}"
    body = json.dumps({"targets": [{"resource": resource, "slot": ""}]}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    wire = served.wire()
    wire.send(
        b"POST /v1/claims HTTP/1.1\r\nHost: x\r\n" + served.auth()
        + b"Content-Type: application/json\r\nContent-Length: 4\r\n"
        + b"Transfer-Encoding: chunked\r\n\r\n" + chunked
    )  # fmt: skip
    answer = wire.answer()
    assert answer.status == 400, answer
    assert wire.closed()
    assert not held(served, resource)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1e2\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n",  # whitespace before the colon
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /heal thz HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
def test_malformed_framing_is_400_and_closes(h11: Served, request_bytes: bytes) -> None:
    wire = h11.wire()
    wire.send(request_bytes)
    try:
        answer = wire.answer()
    except (EOFError, ConnectionResetError):
        return  # closed without a word: also a safe answer
    assert answer.status == 400, answer
    assert wire.closed()


def test_obs_fold_never_smuggles_a_header(h11: Served) -> None:
    # RFC 9112 5.2: reject with 400, or unfold into one value. A folded
    # "Host:" line must not become a second Host (or any) header.
    wire = h11.wire()
    wire.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n Host: evil\r\n\r\n")
    answer = wire.answer()
    assert answer.status in (200, 400), answer
    if answer.status == 200:
        assert_usable(wire)


@pytest.mark.parametrize("size", [MAX_HEAD, 100_000])
def test_overlong_headers_are_refused(served: Served, size: int) -> None:
    # h11 refuses them when they arrive over several reads, and let them
    # through when they came in one; on httptools nothing refused them.
    wire = served.wire()
    try:
        wire.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * size + b"\r\n\r\n")
        answer = wire.answer()
    except (EOFError, ConnectionResetError, BrokenPipeError):
        return  # closed mid-request: refused
    assert answer.status in (400, 431), answer


def test_headers_within_the_limit_are_served(served: Served) -> None:
    wire = served.wire()
    wire.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 8000 + b"\r\n\r\n")
    assert wire.answer().status == 200


@pytest.mark.parametrize(
    "target",
    [b"http://127.0.0.1/healthz", b"HTTP://example.com:80/healthz?x=1", b"http://h/healthz"],
)
def test_an_absolute_form_target_is_served_as_its_path(served: Served, target: bytes) -> None:
    # RFC 9112 3.2.2: a server MUST accept it (h11 passed it on as the path: 404).
    wire = served.wire()
    wire.send(b"GET " + target + b" HTTP/1.1\r\nHost: other\r\n\r\n")
    answer = wire.answer()
    assert answer.status == 200 and answer.json() == {"status": "ok"}, answer
    assert_usable(wire)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET http://a b/healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\x01b\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\x00b\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\x7fb\r\n\r\n",
    ],
)
def test_a_bad_target_or_a_control_character_is_400_and_closes(
    served: Served, request_bytes: bytes
) -> None:
    wire = served.wire()
    wire.send(request_bytes)
    answer = wire.answer()
    assert answer.status == 400, answer
    assert wire.closed()


def test_a_tab_in_a_header_value_is_fine(served: Served) -> None:
    wire = served.wire()
    wire.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\tb\r\n\r\n")
    assert wire.answer().status == 200


def test_an_http_2_request_line_on_http_1_is_505(h11: Served) -> None:
    wire = h11.wire()
    wire.send(b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n")
    answer = wire.answer()
    assert answer.status == 505, answer
    assert wire.closed()


def test_http_1_x_is_served_as_http_1_1(h11: Served) -> None:
    # RFC 9110 2.5: a higher minor version is processed as the highest we know.
    for request in (b"GET /healthz HTTP/1.2\r\n\r\n", b"GET /healthz HTTP/1.9\r\nHost: x\r\n\r\n"):
        wire = h11.wire()
        wire.send(request)
        assert wire.answer().status == (400 if b"Host" not in request else 200)


def test_connect_is_501_this_is_no_proxy(h11: Served) -> None:
    # httptools takes CONNECT for an upgrade and never answers it.
    wire = h11.wire()
    wire.send(b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n")
    assert wire.answer().status == 501


def test_a_target_of_another_scheme_is_400(h11: Served) -> None:
    # (httptools serves ftp://h/healthz as /healthz.)
    wire = h11.wire()
    wire.send(b"GET ftp://h/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wire.answer().status == 400
    assert wire.closed()


def test_a_client_that_leaves_mid_body_is_499_not_an_internal_error(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    resource = f"gone-{uuid.uuid4()}"
    wire = served.wire()
    with caplog.at_level("INFO", logger="dibs.service"):
        wire.send(claim_request(served, resource)[:-5])
        wire.close()
        # The next request on another connection is answered after the first
        # one's handler has seen the disconnect (or the body timeout).
        while not any(getattr(r, "status", None) in (499, 500) for r in caplog.records):
            probe = served.wire()
            assert_usable(probe)
            probe.close()
    assert not [r for r in caplog.records if r.getMessage() == "unhandled error"]
    statuses = [getattr(r, "status", None) for r in caplog.records if r.getMessage() == "request"]
    assert 499 in statuses and 500 not in statuses, statuses
    assert not held(served, resource)


@pytest.mark.parametrize(
    "extra",
    [b"", b"Authorization: Bearer nope\r\n", b"Content-Encoding: gzip\r\n"],
)
def test_an_answer_before_an_expected_body_closes_the_connection(
    served: Served, extra: bytes
) -> None:
    # 401 / 415 before the body was asked for: no 100 Continue went out, so the
    # client may or may not send the body; the next request it writes must not
    # be read as that body (h11 answered it 400, httptools hung).
    wire = served.wire()
    wire.send(
        b"POST /v1/claims HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + extra
        + b"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n"
    )  # fmt: skip
    answer = wire.answer()
    assert answer.status in (401, 415) and answer.closes, answer
    assert wire.closed()


def test_an_expected_body_that_was_asked_for_keeps_the_connection(served: Served) -> None:
    resource = f"continue-{uuid.uuid4()}"
    body = json.dumps({"targets": [{"resource": resource, "slot": ""}]}).encode()
    wire = served.wire()
    wire.send(claim_request(served, resource, body=b"", length=len(body),
                            extra=b"Expect: 100-continue\r\n"))  # fmt: skip
    assert wire.answer().status == 100
    wire.send(body)
    answer = wire.answer()
    assert answer.status == 201 and not answer.closes, answer
    assert_usable(wire)
