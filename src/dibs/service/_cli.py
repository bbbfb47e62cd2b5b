"""The ``dibs serve`` and ``dibs keys`` subcommands, registered by :func:`add_commands`.

Only argparse here at import time: Starlette and uvicorn are imported when
``serve`` runs, so ``dibs`` works without the ``service`` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from dibs._cli_options import (
    add_store_option,
    port,
    positive_int,
    positive_number,
    seconds,
)
from dibs._extras import needs
from dibs.exceptions import InvalidInput
from dibs.service._keys import KeyRing
from dibs.stores import default_url

if TYPE_CHECKING:
    import uvicorn

__all__ = ["add_commands"]

DEFAULT_KEYS = "dibs-keys.json"

# uvicorn's HTTP/1.1 parser. h11, not httptools: httptools answered a request's
# leftover bytes (a Content-Length shorter than the body sent) with a 400 and
# closed the connection before the request itself was answered, although its
# claim was made; it bounded no header size and refused unknown methods as 400.
# h11 answers requests in order, for 50-100 us more server CPU per request
# (benchmarks/bench_service_parsers.py; docs/service.md, "HTTP framing").
# h11 runs through dibs.service._http11, which writes each response in one send.
HTTP_PARSER: Literal["h11", "httptools"] = "h11"


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` and ``keys`` to the ``dibs`` command's subparsers."""
    _add_serve(subparsers)
    _add_keys(subparsers)


def _keys_path(value: str | None) -> Path:
    return Path(value or os.environ.get("DIBS_KEYS") or DEFAULT_KEYS)


def _add_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the HTTP API and the live seat map",
        description=(
            "Serve the JSON API under /v1, the live seat map at /, OpenAPI at /openapi.json "
            "(rendered at /docs), /healthz, /readyz and /metrics, with the store's sweeper "
            "running on a schedule. Needs the service extra: pip install 'dibs[service]'. "
            "See docs/service.md."
        ),
    )
    add_store_option(p, "store to serve")
    p.add_argument(
        "--keys", metavar="FILE", help=f"API keys file (default $DIBS_KEYS, else ./{DEFAULT_KEYS})"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="port (default 8000; 0 picks one)")
    p.add_argument(
        "--showing",
        action="append",
        metavar="SLOT[:ROWSxCOLS]",
        help="a showing to draw a seat map for, e.g. show-42:8x12 "
        "(repeatable; default show-1:8x12)",
    )
    p.add_argument(
        "--lot",
        action="append",
        metavar="NAME:SIZE[:best]",
        help="a parking row served under /v1/lots (repeatable; default lot-1:40)",
    )
    p.add_argument(
        "--rate", type=positive_number, default=50.0, help="requests/s per API key (default 50)"
    )
    p.add_argument(
        "--burst", type=positive_int, default=100, help="burst per API key (default 100)"
    )
    p.add_argument(
        "--max-body",
        type=positive_int,
        default=64 * 1024,
        help="max request body bytes (default 65536)",
    )
    p.add_argument(
        "--request-timeout", type=seconds, default=10.0, help="store call timeout, s (default 10)"
    )
    p.add_argument(
        "--idempotency-wait",
        type=seconds,
        default=5.0,
        help="how long a duplicate Idempotency-Key waits, s (default 5)",
    )
    p.add_argument(
        "--sweep-interval", type=seconds, default=30.0, help="seconds between sweeps (default 30)"
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=32,
        help="worker threads of a store whose calls run on threads: SQLite and plug-in "
        "stores (default 32)",
    )
    p.add_argument(
        "--private-map", action="store_true", help="require an API key for the seat map stream too"
    )
    p.add_argument(
        "--proxy-headers",
        action="store_true",
        help="trust X-Forwarded-* from --forwarded-allow-ips",
    )
    p.add_argument(
        "--forwarded-allow-ips", default="127.0.0.1", help="proxies to trust (default 127.0.0.1)"
    )
    p.add_argument(
        "--id-secret-file",
        metavar="FILE",
        help="a file whose bytes key the opaque claim IDs (default $DIBS_ID_SECRET, else "
        "a secret kept in the store, made by the first instance: every instance on one "
        "store then agrees)",
    )
    p.add_argument("--root-path", default="", help="path prefix when mounted behind a proxy")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.set_defaults(run=_run_serve)


def _id_secret(path: str | None) -> bytes | None:
    """The claim-ID secret: the file's bytes, else $DIBS_ID_SECRET, else None (the store's)."""
    if path is not None:
        return Path(path).read_bytes().strip()
    secret = os.environ.get("DIBS_ID_SECRET")
    return None if not secret else secret.encode()


def _run_serve(args: argparse.Namespace) -> int:
    # Imported here so that the rest of ``dibs`` works without the service extra.
    with needs("service", "dibs serve"):  # the dibs command exits 2 with the message
        import uvicorn  # noqa: PLC0415

        from dibs.service._app import create_app  # noqa: PLC0415
        from dibs.service._config import LotSpec, ServiceConfig, Showing  # noqa: PLC0415
        from dibs.service._guard import JsonFormatter  # noqa: PLC0415
        from dibs.service._http11 import protocol  # noqa: PLC0415
    showings = tuple(Showing.parse(s) for s in args.showing or ["show-1:8x12"])
    config = ServiceConfig(
        store_url=args.store or default_url(),
        keys_file=_keys_path(args.keys),
        showings=showings,
        lots=tuple(LotSpec.parse(x) for x in args.lot or ["lot-1:40"]),
        rate=args.rate,
        burst=args.burst,
        max_body=args.max_body,
        request_timeout=args.request_timeout,
        idempotency_wait=args.idempotency_wait,
        sweep_interval=args.sweep_interval,
        threads=args.threads,
        public_map=not args.private_map,
        id_secret=_id_secret(args.id_secret_file),
    )
    # Logging is set up once the arguments have all been read: a mistake above
    # returns with the process's logging untouched.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(args.log_level.upper())
    # Record fields JsonFormatter never writes, not looked up for every record
    # (~3.5 us of each access-log line): this process's logging is ours.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_config=None,
            access_log=False,
            proxy_headers=args.proxy_headers,
            forwarded_allow_ips=args.forwarded_allow_ips,
            root_path=args.root_path,
            http=protocol(HTTP_PARSER),
            timeout_keep_alive=30,
            timeout_graceful_shutdown=10,
        )
    )

    async def serve() -> None:
        # The store opens on the server's loop before the server binds: a store
        # that cannot open ends the command with its error (exit 2), as
        # dibs.open() of it would, instead of a failed startup.
        await app.state.service.aio.open()
        await server.serve()

    try:
        with asyncio.Runner(loop_factory=_loop_factory(server.config)) as runner:
            runner.run(serve())
    except KeyboardInterrupt:  # a second Ctrl-C, or the one uvicorn re-raises after its shutdown
        pass
    return 0 if server.started else 3  # uvicorn's own status for a failed startup


def _loop_factory(config: uvicorn.Config) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``uvicorn.run`` would serve on (uvloop when installed)."""
    factory = getattr(config, "get_loop_factory", None)
    if factory is not None:  # uvicorn 0.36 and later
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = factory()
        return loop_factory
    config.setup_event_loop()  # earlier: it sets the event loop policy instead
    return None


def _add_keys(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "keys",
        help="create, list and revoke API keys for dibs serve",
        description=(
            "API keys are bearer tokens that name a holder. The keys file keeps only their "
            "SHA-256 digests; a new key is printed once. A running service picks up changes "
            "within a request."
        ),
    )
    p.add_argument(
        "--keys", metavar="FILE", help=f"keys file (default $DIBS_KEYS, else ./{DEFAULT_KEYS})"
    )
    sub = p.add_subparsers(title="actions", metavar="ACTION")
    create = sub.add_parser("create", help="make a key for a holder and print it")
    create.add_argument(
        "--holder", required=True, help="the holder every request with this key acts as"
    )
    create.add_argument("--name", default="", help="a note, e.g. which app uses the key")
    create.add_argument("--json", action="store_true", help="print {id, holder, key} as JSON")
    create.add_argument("--keys", metavar="FILE", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    create.set_defaults(run=_run_keys_create)
    listing = sub.add_parser("list", help="list keys (IDs and holders, never tokens)")
    listing.add_argument(
        "--keys", metavar="FILE", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    listing.set_defaults(run=_run_keys_list)
    revoke = sub.add_parser("revoke", help="delete a key by its ID")
    revoke.add_argument("id", help="the key's ID (dibs keys list)")
    revoke.add_argument("--keys", metavar="FILE", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    revoke.set_defaults(run=_run_keys_revoke)


def _ring(args: argparse.Namespace) -> KeyRing:
    return KeyRing(_keys_path(args.keys))


def _run_keys_create(args: argparse.Namespace) -> int:
    token, record = _ring(args).create(args.holder, name=args.name)
    if args.json:
        print(json.dumps({"id": record.id, "holder": record.holder, "key": token}))
    else:
        print(token)
        print(
            f"key {record.id} for holder {record.holder!r}; shown once, store it now",
            file=sys.stderr,
        )
    return 0


def _run_keys_list(args: argparse.Namespace) -> int:
    for record in _ring(args).list():
        print(f"{record.id}\t{record.holder}\t{record.created_at}\t{record.name}")
    return 0


def _run_keys_revoke(args: argparse.Namespace) -> int:
    if not _ring(args).revoke(args.id):
        raise InvalidInput(f"no key with ID {args.id!r}", field="id", value=args.id)
    return 0
