"""Shared set-up for the service tests: real servers on loopback, keys, clients.

Every service test talks HTTP to a real uvicorn on 127.0.0.1 (in a thread of
the test process, or as a ``python -m dibs.service serve`` subprocess), never
to an in-memory transport, so what is tested is what a client gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import uvicorn

import dibs
from conformance import Conformance
from dibs.aio import AsyncStore
from dibs.service import KeyRing, Service, ServiceConfig, create_app
from dibs.service._cli import HTTP_PARSER
from dibs.service._http11 import protocol
from dibs.service._stores import SharedFace
from dibs.stores.base import Store
from dibs.stores.memory import MemoryStore
from eventually import aeventually, eventually


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Running:
    """A service running on loopback, with a key per named holder."""

    url: str
    keys: KeyRing
    service: Service | None = None
    tokens: dict[str, str] = field(default_factory=dict)
    log: Path | None = None

    def token(self, holder: str) -> str:
        if holder not in self.tokens:
            self.tokens[holder] = self.keys.create(holder)[0]
        return self.tokens[holder]

    def client(self, holder: str | None = None, **options: Any) -> httpx.Client:
        headers = {} if holder is None else {"Authorization": f"Bearer {self.token(holder)}"}
        # A guard against a hung server only: above any fixture's request_timeout.
        options.setdefault("timeout", 150)
        return httpx.Client(base_url=self.url, headers=headers, **options)


class GatedStore(SharedFace):
    """A memory store whose claims wait at a gate the test opens: a slow async store.

    With ``before=True`` a claim waits before it reaches the store (a call cut
    short there made no claim); with ``before=False`` after (it made one).
    Either way the wait is an await, so the service can cancel it.
    """

    def __init__(self, *, before: bool = True) -> None:
        super().__init__(MemoryStore(), threads=1)
        self.before = before
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        self.cancelled = 0

    async def _wait(self) -> None:
        try:
            await aeventually(self.gate.is_set, "the test opens the gate")
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def _claim(self, *args: Any) -> dibs.ClaimResult:
        if reserved(args[0]):
            return await super()._claim(*args)
        self.calls += 1
        self.entered.set()
        if self.before:
            await self._wait()
        result = await super()._claim(*args)
        if not self.before:
            await self._wait()
        return result


def reserved(request: Any) -> bool:
    """Whether a claim (a store's ``_claim`` argument) is the service's own.

    The claim-ID secret and a match key's body are claims on ``dibs.`` units.
    """
    return any(t.resource.startswith("dibs.") for t in request.targets)


@contextlib.contextmanager
def serve_in_thread(
    config: ServiceConfig,
    *,
    store: Store | None = None,
    keys: KeyRing | None = None,
    async_store: AsyncStore | None = None,
    http: Literal["h11", "httptools"] = HTTP_PARSER,
) -> Iterator[Running]:
    """Run the app on uvicorn in a thread of this process until the block ends.

    An ``async_store`` that is a :class:`SharedFace` brings its sync store along.
    ``http`` is uvicorn's parser: ``dibs serve``'s by default.
    """
    ring = keys or KeyRing(None)
    if store is None and isinstance(async_store, SharedFace):
        store = async_store.sync
    app = create_app(config, store=store, async_store=async_store, keys=ring)
    checked = Conformance(app)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            checked,
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="on",
            http=protocol(http),
        )
    )
    thread = threading.Thread(target=asyncio.run, args=(server.serve(),), daemon=True)
    thread.start()
    eventually(lambda: server.started or not thread.is_alive(), "the service starts")
    if not thread.is_alive():
        raise RuntimeError("the service thread died while starting")
    try:
        yield Running(f"http://127.0.0.1:{port}", ring, app.state.service)
    finally:
        server.should_exit = True
        thread.join(30)
    # Every answer the test got, against the document (tests/support/conformance.py).
    problems = checked.problems(app.state.service.document())
    assert not problems, "answers that disagree with /openapi.json:\n" + "\n".join(problems)


@contextlib.contextmanager
def serve_in_process(
    store_url: str, keys_file: Path, *args: str, log_level: str = "warning"
) -> Iterator[Running]:
    """Run ``python -m dibs.service serve`` as a subprocess until the block ends.

    Its stdout and stderr go to ``Running.log``.
    """
    port = free_port()
    log = open(keys_file.with_suffix(f".{port}.log"), "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "dibs.service", "serve", "--store", store_url,
         "--keys", str(keys_file), "--port", str(port), "--log-level", log_level, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"dibs serve exited: {Path(log.name).read_text()}")
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
            return False

        eventually(ready, "dibs serve is ready")
        yield Running(url, KeyRing(keys_file), log=Path(log.name))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
