"""The OpenAPI document as a client generator reads it: every schema complete and valid.

A generator (openapi-python-client, openapi-generator) gives up on an array
without ``items``, and then on every 200 that contains one. These tests walk
the whole document rather than the schemas someone remembered to check.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate

from dibs.service import ServiceConfig, Showing
from dibs.service._config import LotSpec
from dibs.service._openapi import openapi_document
from service_support import Running, serve_in_thread

pytestmark = pytest.mark.timeout(120)


def _walk(node: object, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every JSON object in the document, with a JSON-pointer-like path."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{where}/{i}")


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi_document(100, ("lot-1",), ("show-1",))


def test_every_array_schema_has_items(document: dict[str, Any]) -> None:
    bare = [
        where
        for where, node in _walk(document, "#")
        if "array" in _types(node) and "items" not in node and "prefixItems" not in node
    ]
    assert bare == []


def _schemas_of_responses(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, op in item.items():
            for status, answer in op["responses"].items():
                for media, content in answer.get("content", {}).items():
                    yield f"{method.upper()} {path} {status} {media}", content["schema"]


def test_the_document_and_every_response_schema_validate(document: dict[str, Any]) -> None:
    validate(document)
    schemas = document["components"]["schemas"]
    seen = 0
    for where, schema in _schemas_of_responses(document):
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise AssertionError(where) from exc
        seen += 1
    for where, node in _walk(document, "#"):
        if isinstance(node.get("$ref"), str):
            prefix, _, name = node["$ref"].rpartition("/")
            assert prefix == "#/components/schemas" and name in schemas, where
    assert seen > 40


@pytest.fixture(scope="module")
def svc() -> Iterator[Running]:
    config = ServiceConfig(
        store_url="memory://",
        keys_file=None,
        showings=(Showing("show-1", 2, 3),),
        lots=(LotSpec("lot-1", 4),),
    )
    with serve_in_thread(config) as running:
        yield running


def _check(document: dict[str, Any], path: str, method: str, r: httpx.Response) -> None:
    answer = document["paths"][path][method]["responses"][str(r.status_code)]
    (media,) = answer["content"]
    assert r.headers["content-type"].split(";")[0] == media, (path, r.status_code)
    schema = {**answer["content"][media]["schema"], "components": document["components"]}
    jsonschema.Draft202012Validator(schema).validate(r.json())


def test_every_documented_200_answer_matches_its_schema(svc: Running) -> None:
    """The live answers of every list and read, the ones a generated client parses."""
    with svc.client("alice") as c:
        document = c.get("/openapi.json").json()
        claim = c.post(
            "/v1/claims",
            json={"targets": [{"resource": "seat-A1", "slot": "show-1"}], "ttl": 60},
        )
        assert claim.status_code == 201
        _check(document, "/v1/claims", "post", claim)
        parked = c.post("/v1/lots/lot-1/vehicles", json={"vehicle": "van"})
        _check(document, "/v1/lots/{lot}/vehicles", "post", parked)
        for path, template in [
            ("/v1/claims", "/v1/claims"),
            (f"/v1/claims/{claim.json()['id']}", "/v1/claims/{claim_id}"),
            ("/v1/lots", "/v1/lots"),
            ("/v1/lots/lot-1", "/v1/lots/{lot}"),
            ("/v1/lots/lot-1/vehicles/van", "/v1/lots/{lot}/vehicles/{vehicle}"),
            ("/v1/showings", "/v1/showings"),
            ("/v1/showings/show-1", "/v1/showings/{slot}"),
            ("/v1/resources/seat-A1?slot=show-1", "/v1/resources/{resource}"),
            ("/healthz", "/healthz"),
            ("/readyz", "/readyz"),
        ]:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            _check(document, template, "get", r)


# --- a generated client (the generator is never a dependency of dibs) -----------------------


@pytest.fixture(scope="session")
def generator() -> str:
    """``openapi-python-client``: $DIBS_OPENAPI_PYTHON_CLIENT, else on PATH, else installed
    from PyPI into a virtualenv of its own (its pinned ruff must not replace the project's)."""
    found = os.environ.get("DIBS_OPENAPI_PYTHON_CLIENT") or shutil.which("openapi-python-client")
    if found:
        return found
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = cache / "dibs-tests" / "openapi-python-client"
    exe = venv / "bin" / "openapi-python-client"
    if not exe.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300
        )
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "--disable-pip-version-check", "openapi-python-client"],
            check=True, timeout=900,
        )  # fmt: skip
    return str(exe)


@pytest.mark.slow  # installs the generator from PyPI on a fresh machine: scripts/test --slow
def test_openapi_python_client_generates_a_model_for_every_200(
    document: dict[str, Any], tmp_path: Path, svc: Running, generator: str
) -> None:
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(document))
    run = subprocess.run(
        [generator, "generate", "--path", str(spec), "--output-path", str(tmp_path / "client")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    # The generator warns, and drops the endpoint, for every schema it cannot read.
    assert "Unable to" not in out and "Warning" not in out, out
    api = tmp_path / "client" / "dibs_client" / "api"
    generated = {p.stem for p in api.rglob("*.py") if p.stem != "__init__"}
    operations = {op["operationId"] for item in document["paths"].values() for op in item.values()}
    snake = {"".join("_" + ch.lower() if ch.isupper() else ch for ch in o) for o in operations}
    assert snake <= generated, snake - generated
    _the_generated_client_parses_every_200(tmp_path / "client", svc)


def _the_generated_client_parses_every_200(where: Path, svc: Running) -> None:
    """Call each read through the generated client: every 200 becomes its model, not None."""
    sys.path.insert(0, str(where))
    try:
        client_module = importlib.import_module("dibs_client")
        ops = {
            name: importlib.import_module(f"dibs_client.api.default.{name}")
            for name in (
                "list_claims", "get_claim", "list_lots", "get_lot", "get_vehicle",
                "list_showings", "get_showing", "get_resource", "health", "readiness",
            )
        }  # fmt: skip
        with svc.client("gen") as c:
            claim = c.post("/v1/claims", json={"targets": [{"resource": "g", "slot": ""}]})
            c.post("/v1/lots/lot-1/vehicles", json={"vehicle": "gen-van"})
        generated = client_module.AuthenticatedClient(base_url=svc.url, token=svc.token("gen"))
        with generated as client:
            _read_through(ops, client, claim.json()["id"])
            _write_through(client)
    finally:
        sys.path.remove(str(where))
        for name in [m for m in sys.modules if m == "dibs_client" or m.startswith("dibs_client.")]:
            del sys.modules[name]


def _read_through(ops: dict[str, Any], client: Any, claim_id: str) -> None:
    answers = {
        "list_claims": ops["list_claims"].sync_detailed(client=client),
        "get_claim": ops["get_claim"].sync_detailed(claim_id, client=client),
        "list_lots": ops["list_lots"].sync_detailed(client=client),
        "get_lot": ops["get_lot"].sync_detailed("lot-1", client=client),
        "get_vehicle": ops["get_vehicle"].sync_detailed("lot-1", "gen-van", client=client),
        "list_showings": ops["list_showings"].sync_detailed(client=client),
        "get_showing": ops["get_showing"].sync_detailed("show-1", client=client),
        "get_resource": ops["get_resource"].sync_detailed("g", client=client, slot=""),
        "health": ops["health"].sync_detailed(client=client),
        "readiness": ops["readiness"].sync_detailed(client=client),
    }
    for name, answer in answers.items():
        assert answer.status_code == 200, (name, answer.content)
        assert answer.parsed is not None, name
        assert type(answer.parsed).__name__ != "Error", name
    lots = answers["list_lots"].parsed.lots  # type: ignore[union-attr]
    assert [(lot.name, lot.size) for lot in lots] == [("lot-1", 4)]
    missing = ops["get_claim"].sync_detailed("A" * 16, client=client)
    assert missing.status_code == 404
    assert type(missing.parsed).__name__ == "Error" and missing.parsed.error == "not_found"


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, op in item.items():
            yield f"{method.upper()} {path}", op


def test_every_error_answer_is_documented_as_a_problem(document: dict[str, Any]) -> None:
    for where, op in _operations(document):
        for status, answer in op["responses"].items():
            if int(status) >= 400:
                assert answer["content"] == {
                    "application/problem+json": {"schema": {"$ref": "#/components/schemas/Error"}}
                }, (where, status)


def test_every_operation_documents_the_errors_its_steps_can_answer(
    document: dict[str, Any],
) -> None:
    """A body can be too slow, too large or not JSON; a key can be missing or over its rate."""
    for where, op in _operations(document):
        statuses = set(op["responses"])
        if "requestBody" in op:
            assert {"400", "408", "413", "415"} <= statuses, where
        if op.get("security") or where.startswith("GET /v1/showings"):
            assert {"401", "429"} <= statuses, where


def test_a_private_seat_map_answers_its_documented_401() -> None:
    config = ServiceConfig(
        store_url="memory://", keys_file=None, public_map=False, showings=(Showing("show-1"),)
    )
    with serve_in_thread(config) as s, s.client() as anon:
        document = anon.get("/openapi.json").json()
        for path, template in [
            ("/v1/showings", "/v1/showings"),
            ("/v1/showings/show-1", "/v1/showings/{slot}"),
            ("/v1/showings/show-1/events", "/v1/showings/{slot}/events"),
        ]:
            r = anon.get(path)
            assert r.status_code == 401, path
            _check(document, template, "get", r)


def _write_through(client: Any) -> None:
    """Every write through the generated client, each answer parsed into its success model."""
    api = "dibs_client.api.default."
    models = importlib.import_module("dibs_client.models")
    call = {
        name: importlib.import_module(api + name).sync_detailed
        for name in (
            "create_claim", "extend_claim", "confirm_claim", "release_claim",
            "park_vehicle", "unpark_vehicle", "match",
        )
    }  # fmt: skip

    def ok(answer: Any, status: int) -> Any:
        assert answer.status_code == status, answer.content
        assert answer.parsed is not None and type(answer.parsed).__name__ != "Error"
        return answer.parsed

    unit = models.Unit(resource="gen-seat", slot="s")
    made = ok(
        call["create_claim"](
            client=client, body=models.ClaimRequest(targets=[unit], ttl=60), idempotency_key='"g1"'
        ),
        201,
    )
    extended = ok(
        call["extend_claim"](
            made.id, client=client, body=models.ExtendRequest(fence=made.fence, ttl=60)
        ),
        200,
    )
    assert extended.id == made.id
    ok(
        call["confirm_claim"](made.id, client=client, body=models.FenceRequest(fence=made.fence)),
        200,
    )
    released = ok(call["release_claim"](made.id, client=client, fence=made.fence), 200)
    assert released.released is True
    ok(
        call["park_vehicle"]("lot-1", client=client, body=models.ParkRequest(vehicle="gen-car")),
        201,
    )
    ok(call["unpark_vehicle"]("lot-1", "gen-car", client=client), 200)
    matched = ok(
        call["match"](
            client=client,
            body=models.MatchRequest(candidates=[models.Unit(resource="gen-driver", slot="s")]),
            idempotency_key='"gen-ride"',
        ),
        201,
    )
    assert matched.candidate.resource == "gen-driver"
