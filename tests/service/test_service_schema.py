"""The OpenAPI document admits exactly what the service's parsers do, for every route.

For each input a route's handler parses (a body, the Idempotency-Key header,
a path or query parameter), Hypothesis draws values from the *documented*
JSON Schema, and mutations of them (a member dropped or added, a value
replaced by one at or past a limit, of another type, with a control
character), and checks both ways:

- valid per the document ⇒ the parser accepts, unless it refuses on a rule
  JSON Schema cannot state, which it says by raising ``Unstated`` (a span's
  start before its end, a lot's size);
- the parser accepts ⇒ valid per the document.

The answers' side is in ``tests/support/conformance.py``: every answer any
service test gets is checked against its status's documented schema.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from dibs.exceptions import InvalidInput
from dibs.service._openapi import openapi_document
from dibs.service._routes import Operation, Param, operations
from dibs.service._schema import Unstated
from dibs.service._wire import BOUND, park_request, parse_query_bound, parse_query_fence

pytestmark = pytest.mark.timeout(300)

MAX_TARGETS = 3  # small, so that samples reach the limit and past it
LOT_SIZE = 4
DOCUMENT = openapi_document(MAX_TARGETS, ("lot-1",), ("show-1",))
COMPONENTS = DOCUMENT["components"]["schemas"]

# Path parameters whose handler does not parse them into a 400: a claim ID that
# is not one of ours, a lot or showing that is not configured, are a 404; another
# holder in ?holder= is a 403.
LOOKED_UP = {"claim_id", "lot", "holder", ("path", "slot")}


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    """``pattern`` as ECMA-262 reads it: Python's ``$`` also matches before a final newline."""
    if isinstance(instance, str):
        python = (
            pattern[:-1] + r"\Z"
            if pattern.endswith("$") and not pattern.endswith("\\$")
            else pattern
        )
        if re.search(python, instance) is None:
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _ecma_pattern}
)


@functools.cache
def _validator(path: str, method: str, param: Param | None) -> Any:
    (op,) = [o for o in operations(MAX_TARGETS) if (o.path, o.method) == (path, method)]
    return validator(_documented(op, param))


def validator(schema: dict[str, Any]) -> Any:
    return Validator(
        {**schema, "components": DOCUMENT["components"]},
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


# --- values drawn from a JSON Schema (the subset the document uses) -----------------------------


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = COMPONENTS[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _times() -> st.SearchStrategy[str]:
    """RFC 3339 times with an offset, in the spellings the pattern admits."""
    offsets = st.sampled_from(["Z", "z", "+00:00", "+05:30", "-08:00", "+14:00"])
    fraction = st.integers(0, 9).map(lambda n: "" if n == 0 else "." + "1234567890"[:n])
    moments = st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30))
    return st.builds(
        lambda m, t, f, o: f"{m.year:04d}" + m.strftime(f"-%m-%d{t}%H:%M:%S") + f + o,
        moments,
        st.sampled_from("Tt"),
        fraction,
        offsets,
    )


def _edges(low: float | None, high: float | None, step: float) -> st.SearchStrategy[Any]:
    """The limits of a range, and just past them."""
    edges = [e for b in (low, high) if b is not None for e in (b - step, b, b + step)]
    return st.sampled_from(edges) if edges else st.nothing()


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid per ``schema``, and values at and just past each of its limits.

    Which are valid is the validator's to say: the test checks both kinds.
    """
    schema = _resolve(schema)
    if "oneOf" in schema:
        return st.one_of([from_schema(s) for s in schema["oneOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        return st.integers(low, high) | _edges(low, high, 1)
    if kind == "number":
        low, high = schema.get("minimum"), schema.get("maximum")
        return (
            st.integers(
                None if low is None else int(-(-low // 1)), None if high is None else int(high // 1)
            )
            | st.floats(low, high, allow_nan=False, allow_infinity=False)
            | _edges(low, high, 1)
            | _edges(low, high, 1e-6)
        )
    if kind == "string":
        strings: st.SearchStrategy[str]
        if schema.get("format") == "date-time":
            strings = _times()
        elif "pattern" in schema:
            strings = st.from_regex(schema["pattern"], fullmatch=True)
        else:
            strings = st.text()
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if high is None:
            return strings.filter(lambda s: low <= len(s))
        # And strings at the limits and just past them (the test sorts out which are valid).
        padded = st.builds(lambda s, n: (s * n)[:n] if s else "", strings, st.sampled_from(
            [high, high + 1, max(low - 1, 0)]))  # fmt: skip
        return strings.filter(lambda s: low <= len(s) <= high) | padded
    if kind == "array":
        items = from_schema(schema["items"])
        return st.lists(
            items,
            min_size=max(schema.get("minItems", 0) - 1, 0),
            max_size=schema.get("maxItems", 4) + 1,
        )
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: from_schema(v) for k, v in props.items() if k in required},
            optional={k: from_schema(v) for k, v in props.items() if k not in required},
        )
    raise AssertionError(f"no strategy for {schema}")


# Values at and past every limit of the wire format, of every JSON type.
NASTY: list[Any] = [
    None, True, False, 0, -1, 1, 2, 0.5, 1.0, 5.0, 2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1,
    2**63, 10**30, 0.0009, 0.001, 31622400, 31622400.5, 1e300, -1e300, "", "a", "5",
    "dibs.x", "dibs", "x" * 200, "x" * 201, "a\x00", "a\x7f", "\x9f", "a\ud800", "a\n", "a\t",
    " a", "é", "2026-12-03T14:00:00Z", "2026-13-03T14:00:00Z", "2026-12-03T14:00:60Z",
    "2026-12-03T14:00:00", "2026-12-03 14:00:00Z", "0001-01-01T00:30:00+01:00",
    "9999-12-31T23:59:59-01:00", [], {}, [1], {"resource": "r"}, {"resource": "r", "slot": ""},
    {"resource": "r", "start": 1, "end": 2}, {"resource": "r", "start": 2, "end": 1},
]  # fmt: skip


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _get(value: Any, at: tuple[Any, ...]) -> Any:
    for step in at:
        value = value[step]
    return value


def _put(value: Any, at: tuple[Any, ...], new: Any) -> Any:
    """A copy of ``value`` with the node at ``at`` replaced (``_DROP``: removed)."""
    if not at:
        return new
    copy = json.loads(json.dumps(value))  # a deep copy; every value here is JSON
    parent = _get(copy, at[:-1])
    if new is _DROP:
        del parent[at[-1]]
    else:
        parent[at[-1]] = new
    return copy


_DROP = object()


@st.composite
def mutated(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> Any:
    """A valid value, then one to three changes anywhere in it."""
    value = draw(values)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(list(_paths(value))))
        node = _get(value, at)
        choices: list[Any] = [st.sampled_from(NASTY)]
        if at:
            choices.append(st.just(_DROP))
        if isinstance(node, dict):
            choices.append(st.sampled_from(["x", "slot", "start", "end", "ttl"]).map(
                lambda k, node=node: {**node, k: draw(st.sampled_from(NASTY))}))  # fmt: skip
        if isinstance(node, list) and node:
            choices.append(st.just([*node, *node, *node]))
        if isinstance(node, str):
            prefixes = ["\x00", "\x1f", "\ud800", "\n", "x" * 200, "dibs."]
            choices.append(st.sampled_from(prefixes).map(
                lambda extra, node=node: extra + node))  # fmt: skip
        if isinstance(node, int | float) and not isinstance(node, bool):
            choices.append(st.sampled_from([-1, 1, 0.5, 2**53, 10**20]).map(
                lambda d, node=node: node + d))  # fmt: skip
            choices.append(st.just(str(node)))
        new = draw(st.one_of(choices))
        value = _put(value, at, new)
    return value


# --- the inputs of every route, with the parser its handler runs --------------------------------


def _header(value: Any) -> bool:
    """What can reach the handler as a header value: HTTP strips surrounding spaces and tabs,
    and the framing middleware refuses control characters (RFC 9110, 5.5)."""
    return (
        isinstance(value, str)
        and value == value.strip(" \t")
        and not any(ord(c) < 0x20 or c == "\x7f" for c in value)
        and all(ord(c) < 0x100 for c in value)  # latin-1: header bytes
    )


def _query_text(value: Any) -> str | None:
    """A query parameter's value as its text in the URL (None: not a query value)."""
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _parser(op: Operation, param: Param | None) -> Callable[[Any], Any] | None:
    if param is None:
        assert op.body is not None
        # The handler parses a lot's body with its lot's size, which the document cannot state.
        body = park_request(LOT_SIZE) if op.handler == "patterns.park" else op.body
        return body.parse
    if param.name in LOOKED_UP or (param.where, param.name) in LOOKED_UP:
        return None
    if param.where == "query" and param.name == "fence":
        return lambda value: parse_query_fence(_text(value))
    if param.where == "query" and param.name in ("start", "end"):
        return lambda value: BOUND.parse(parse_query_bound(_text(value)), param.name)
    if param.where == "query":
        return lambda value: param.schema.parse(_text(value), param.name)
    return lambda value: param.schema.parse(value, param.name)


_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _from_query(text: str, schema: dict[str, Any]) -> Any:
    """A query value as its schema reads it: a number if the schema admits one and it is one."""
    if _resolve(schema).get("type") != "string" and _JSON_NUMBER.fullmatch(text):
        number = json.loads(text)
        if math.isfinite(number):
            return number
    return text


def _text(value: Any) -> str:
    text = _query_text(value)
    if text is None:
        raise InvalidInput("not a query value", field="query", value=None)
    return text


def _documented(op: Operation, param: Param | None) -> dict[str, Any]:
    doc_op = DOCUMENT["paths"][op.path][op.method.lower()]
    if param is None:
        schema: dict[str, Any] = doc_op["requestBody"]["content"]["application/json"]["schema"]
        return schema
    (found,) = [
        p for p in doc_op["parameters"] if (p["in"], p["name"]) == (param.where, param.name)
    ]
    schema = found["schema"]
    return schema


CASES = [
    pytest.param(
        op, param, id=f"{op.method} {op.path} {param.where + ' ' + param.name if param else 'body'}"
    )
    for op in operations(MAX_TARGETS)
    if op.operation_id is not None
    for param in (*op.params, *([None] if op.body is not None else []))
    if _parser(op, param) is not None
]


def test_every_parsed_input_of_every_documented_route_is_a_case() -> None:
    ids = {c.id for c in CASES}
    assert len(CASES) >= 15, ids
    assert {
        "POST /v1/claims body",
        "POST /v1/claims header Idempotency-Key",
        "POST /v1/claims/{claim_id}/extend body",
        "DELETE /v1/claims/{claim_id} query fence",
        "GET /v1/resources/{resource} query start",
        "POST /v1/lots/{lot}/vehicles body",
        "GET /v1/lots/{lot}/vehicles/{vehicle} path vehicle",
        "POST /v1/match body",
        "POST /v1/semaphores/{key}/permits body",
        "POST /v1/semaphores/{key}/permits path key",
        "POST /v1/semaphores/{key}/permits header Idempotency-Key",
        "PUT /v1/semaphores/{key} body",
        "POST /v1/rate-limits/{key}/acquire body",
        "PUT /v1/waitlists/{key} body",
        "POST /v1/waitlists/{key}/release body",
        "POST /v1/waitlists/{key}/offers/{claim_id}/accept body",
        "POST /v1/waitlists/{key}/entries path key",
    } <= ids


@pytest.mark.parametrize(("op", "param"), CASES)
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_document_admits_exactly_what_the_parser_does(
    op: Operation, param: Param | None, data: st.DataObject
) -> None:
    schema = _documented(op, param)
    parse = _parser(op, param)
    assert parse is not None
    drawn = from_schema(schema)
    value = data.draw(st.one_of(drawn, mutated(drawn)), label="value")
    if param is not None and param.where == "header" and not _header(value):
        return
    if param is not None and param.where == "query" and _query_text(value) is None:
        return
    if param is not None and param.where == "query":
        # The document's value is the text read as its schema reads it: a number if it is one.
        value = _from_query(_text(value), _documented(op, param))
    valid = _validator(op.path, op.method, param).is_valid(value)
    try:
        parse(value)
    except Unstated:
        return  # a rule the document cannot state (the value may break a stated one too)
    except InvalidInput as exc:
        assert not valid, f"the document admits what the parser refuses: {exc} ({exc.field})"
        return
    assert valid, "the parser accepts what the document refuses"


# --- every limit, deterministically: each node of a valid value set to each edge ----------------


def instances(schema: dict[str, Any]) -> list[Any]:
    """A few valid values of ``schema``: each branch of each ``oneOf``, each member present."""
    schema = _resolve(schema)
    if "oneOf" in schema:
        return [v for s in schema["oneOf"] for v in instances(s)]
    if "const" in schema:
        return [schema["const"]]
    if "enum" in schema:
        return list(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return [v for k in kind for v in instances({**schema, "type": k})]
    low, high = schema.get("minimum"), schema.get("maximum")
    if kind in ("integer", "number"):
        middle = 0 if low is None or high is None else (low + high) / 2
        value = max(low if low is not None else middle, min(middle, high or middle))
        return [int(value) if kind == "integer" else value]
    if kind == "string":
        if schema.get("format") == "date-time":
            return ["2026-12-03T14:00:00Z", "2026-12-03t14:00:00.5+02:00"]
        fits = validator(schema).is_valid
        tries = (*schema.get("examples", ()), "a", "seat-14A", '"k-1"', 'a\\"b', "A" * 16, "é")
        found = [c for c in tries if fits(c)]
        assert found, schema
        return found
    if kind in ("null", "boolean"):
        return [None] if kind == "null" else [True]
    if kind == "array":
        return [[v] * max(schema.get("minItems", 1), 1) for v in instances(schema["items"])]
    if kind == "object":
        props = schema.get("properties", {})
        base = {k: instances(v)[0] for k, v in props.items()}
        found = [base, {k: v for k, v in base.items() if k in schema.get("required", ())}]
        for k, v in props.items():
            found += [{**base, k: other} for other in instances(v)[1:]]
        return found
    raise AssertionError(f"no instance of {schema}")


def _edge_values(schema: dict[str, Any], node: Any) -> list[Any]:
    """What to put at a node: its schema's limits and just past them, and the nasty values."""
    schema = _resolve(schema)
    out: list[Any] = list(NASTY)
    for branch in schema.get("oneOf", [schema]):
        s = _resolve(branch)
        for bound in (s.get("minimum"), s.get("maximum")):
            if bound is not None:
                out += [bound - 1, bound, bound + 1, bound - 1e-6, bound + 1e-6, float(bound)]
        for size in (s.get("minLength"), s.get("maxLength")):
            if size is not None and isinstance(node, str) and node:
                out += [(node * (size + 2))[:n] for n in (max(size - 1, 0), size, size + 1)]
        for size in (s.get("minItems"), s.get("maxItems")):
            if size is not None and isinstance(node, list) and node:
                out += [[node[0]] * n for n in (max(size - 1, 0), size, size + 1)]
    if isinstance(node, dict):
        out += [{k: v for k, v in node.items() if k != drop} for drop in node]
        out += [{**node, extra: 1} for extra in ("x", "slot", "start", "end", "ttl")]
    if isinstance(node, str):
        out += [prefix + node for prefix in ("\x00", "\x1f", "\x7f", "\ud800", "dibs.", " ")]
        out += [node + suffix for suffix in ("\n", "\x9f", " ")]
    return out


def _schema_at(schema: dict[str, Any], value: Any, at: tuple[Any, ...]) -> dict[str, Any]:
    """The subschema that describes the node at ``at`` (the first branch that fits)."""
    for step in at:
        schema = _resolve(schema)
        branches = [_resolve(b) for b in schema.get("oneOf", [schema])]
        schema = next((b for b in branches if validator(b).is_valid(value)), branches[0])
        value = value[step]
        schema = schema["items"] if isinstance(step, int) else schema["properties"][step]
    return schema


@pytest.mark.parametrize(("op", "param"), CASES)
def test_every_limit_of_the_document_is_the_parser_s(op: Operation, param: Param | None) -> None:
    """Each node of each valid value, set to each edge of its schema: the same answer both ways."""
    schema = _documented(op, param)
    parse = _parser(op, param)
    assert parse is not None
    check = _validator(op.path, op.method, param)
    checked = 0
    for base in instances(schema):
        assert check.is_valid(_as_documented(op, param, base)), base
        for at in _paths(base):
            for new in _edge_values(_schema_at(schema, base, at), _get(base, at)):
                value = _put(base, at, new)
                if param is not None and param.where == "header" and not _header(value):
                    continue
                if param is not None and param.where == "query" and _query_text(value) is None:
                    continue
                valid = check.is_valid(_as_documented(op, param, value))
                try:
                    parse(value)
                except Unstated:
                    continue
                except InvalidInput as exc:
                    assert not valid, (value, f"the document admits what the parser refuses: {exc}")
                    continue
                finally:
                    checked += 1
                assert valid, (value, "the parser accepts what the document refuses")
    assert checked > 40


def _as_documented(op: Operation, param: Param | None, value: Any) -> Any:
    if param is not None and param.where == "query":
        return _from_query(_text(value), _documented(op, param))
    return value


def test_a_sample_of_each_kind_reaches_the_check() -> None:
    """The strategies are not vacuous: valid samples exist, and mutations make invalid ones.

    Asked as existence (``find``), not as a count over random draws: a count is a
    property of the seed, and a threshold that most seeds pass fails some runs.
    """
    body = _documented(operations(MAX_TARGETS)[0], None)
    check = validator(body)
    # Existence only: the first sample found answers it, so no shrinking towards a smaller one.
    quiet = settings(
        max_examples=2000,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    assert check.is_valid(find(from_schema(body), check.is_valid, settings=quiet))
    invalid = find(mutated(from_schema(body)), lambda v: not check.is_valid(v), settings=quiet)
    assert not check.is_valid(invalid)


def test_times_are_rfc_3339() -> None:
    moment = datetime(2026, 12, 3, 14, tzinfo=timezone(timedelta(hours=2)))
    assert BOUND.parse(moment.isoformat(), "t") == moment.astimezone(UTC)
