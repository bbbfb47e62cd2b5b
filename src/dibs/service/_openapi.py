"""The OpenAPI 3.1 document of the service, rendered from the route table, and its HTML page.

Nothing here describes a value: every schema is the one its parser or builder
uses (:mod:`dibs.service._wire`, ``_guard``), and every operation, status and
header comes from :mod:`dibs.service._routes`, the table the app's routes are
built from. ``tests/service/test_service_schema.py`` checks that each schema admits
exactly what its parser does and that every answer the tests see matches its
status's schema; schemathesis checks the live service against the document.
"""

from __future__ import annotations

import html
import json
from functools import cache
from typing import Any

from dibs.service._guard import PROBLEMS
from dibs.service._routes import Answer, Operation, Param, operations
from dibs.service._schema import Components, Json, Text, examples

__all__ = ["openapi_document", "render_docs"]


def _answer(answer: Answer, components: Components) -> Json:
    out: Json = {"description": answer.description}
    if answer.headers:
        out["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in answer.headers.items()
        }
    if answer.schema is not None:
        out["content"] = {answer.media: {"schema": components.render(answer.schema)}}
    if answer.links:
        out["links"] = dict(answer.links)
    return out


def _param(param: Param, components: Components, names: dict[str, tuple[str, ...]]) -> Json:
    schema = param.schema
    offered = names.get(param.examples or "", ())
    if offered and isinstance(schema, Text):
        schema = examples(schema, offered)
    out: Json = {"name": param.name, "in": param.where, "required": param.required}
    if param.description is not None:
        out["description"] = param.description
    out["schema"] = components.render(schema)
    if offered:
        out["example"] = offered[0]
    return out


def _operation(op: Operation, components: Components, names: dict[str, tuple[str, ...]]) -> Json:
    assert op.operation_id is not None
    out: Json = {"summary": op.summary}
    if op.description is not None:
        out["description"] = op.description
    out["operationId"] = op.operation_id
    if op.security:
        out["security"] = [{"bearer": []}]
    if op.params:
        out["parameters"] = [_param(p, components, names) for p in op.params]
    if op.body is not None:
        out["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": components.render(op.body)}},
        }
    out["responses"] = {
        status: _answer(answer, components) for status, answer in op.answers.items()
    }
    return out


@cache
def _document_text(max_targets: int, lots: tuple[str, ...], showings: tuple[str, ...]) -> str:
    components = Components()
    names = {"lots": lots, "showings": showings}
    paths: dict[str, Json] = {}
    for op in operations(max_targets):
        if op.operation_id is not None:
            paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, components, names)
    return json.dumps(
        {
            "openapi": "3.1.0",
            "info": {
                "title": "dibs",
                "version": "1",
                "description": "Claim a named, indivisible thing exactly once. The holder is "
                "always the API key's; another holder's claims answer 404.",
            },
            "paths": paths,
            "components": {
                "schemas": components.schemas,
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
        }
    )


def openapi_document(
    max_targets: int = 100, lots: tuple[str, ...] = (), showings: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A fresh copy of the OpenAPI document of a service with these limits, lots and showings."""
    doc: dict[str, Any] = json.loads(_document_text(max_targets, lots, showings))
    return doc


def render_docs(doc: dict[str, Any]) -> str:
    """The document as one self-contained HTML page (no scripts, no CDN)."""
    esc = html.escape
    parts = [
        "<!doctype html><meta charset=utf-8><title>dibs API</title>",
        "<style>body{font:15px/1.45 system-ui,sans-serif;max-width:60em;margin:2em auto;"
        "padding:0 1em}code,pre{background:#f4f4f4;padding:.1em .3em}pre{padding:.6em;"
        "overflow:auto}h2{border-top:1px solid #ddd;padding-top:.8em}.m{font-weight:bold;"
        "text-transform:uppercase;margin-right:.5em}</style>",
        f"<h1>{esc(doc['info']['title'])} API v{esc(doc['info']['version'])}</h1>",
        f"<p>{esc(doc['info']['description'])}</p>",
        '<p>Machine-readable: <a href="/openapi.json">/openapi.json</a>.</p>',
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            parts.append(
                f"<h2 id={esc(op['operationId'])}><span class=m>{esc(method)}</span>"
                f"<code>{esc(path)}</code></h2><p><b>{esc(op['summary'])}</b></p>"
            )
            if "description" in op:
                parts.append(f"<p>{esc(op['description'])}</p>")
            if op.get("security"):
                parts.append("<p>Needs <code>Authorization: Bearer &lt;API key&gt;</code>.</p>")
            for param in op.get("parameters", []):
                parts.append(
                    f"<p>{esc(param['in'])} <code>{esc(param['name'])}</code>"
                    f"{' (required)' if param.get('required') else ''} "
                    f"{esc(param.get('description', ''))}</p>"
                )
            if "requestBody" in op:
                schema = op["requestBody"]["content"]["application/json"]["schema"]
                name = schema.get("$ref", "").rsplit("/", 1)[-1]
                body = doc["components"]["schemas"].get(name, schema)
                parts.append(
                    f"<p>Body <code>{esc(name)}</code>:</p>"
                    f"<pre>{esc(json.dumps(body, indent=1))}</pre>"
                )
            parts.append("<ul>")
            for status, answer in op["responses"].items():
                parts.append(f"<li><code>{esc(status)}</code> {esc(answer['description'])}</li>")
            parts.append("</ul>")
    parts.append(
        "<h2 id=problems>Problems</h2><p>Every error is an RFC 9457 problem "
        "details document (<code>application/problem+json</code>); its "
        "<code>type</code> links here.</p>"
    )
    for code, (title, text) in PROBLEMS.items():
        parts.append(
            f"<h3 id=problem-{esc(code)}><code>{esc(code)}</code>: {esc(title)}</h3>"
            f"<p>{esc(text)}</p>"
        )
    parts.append("<h2>Schemas</h2>")
    for name, schema in doc["components"]["schemas"].items():
        parts.append(
            f"<h3 id={esc(name)}>{esc(name)}</h3><pre>{esc(json.dumps(schema, indent=1))}</pre>"
        )
    return "".join(parts)
