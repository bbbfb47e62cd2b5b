"""Wire schemas: small objects that each parse one JSON value and render it as JSON Schema.

One object per value is both the parser the API runs and the schema the
OpenAPI document shows, so the two cannot drift. A request schema's
:meth:`Schema.parse` raises :class:`~dibs.InvalidInput` naming the JSON field
at fault (``targets[2].slot``); a rule JSON Schema cannot state (a span's start
before its end) raises :class:`Unstated`, a subclass the API answers the same
way, so that a test can tell the two apart. Response schemas only render: the
builders beside them (``claim_to_wire``) make the JSON, and the tests check
every answer against the rendering.

:class:`Components` renders a schema: a named one once, under
``#/components/schemas/``, and a ``$ref`` wherever it is used.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dibs.exceptions import InvalidInput

__all__ = [
    "Array",
    "Boolean",
    "Choice",
    "Components",
    "Const",
    "Enum",
    "Integer",
    "Json",
    "MapOf",
    "Nullable",
    "Number",
    "Obj",
    "OneOf",
    "Prop",
    "Raw",
    "Schema",
    "Text",
    "Unstated",
    "examples",
]

Json = dict[str, Any]


class Unstated(InvalidInput):
    """Raised for input the JSON Schema admits but a rule it cannot state refuses."""


class Schema:
    """One JSON value on the wire: how to parse it, and its JSON Schema.

    ``name`` makes it a component (rendered once, referred to by ``$ref``).
    """

    name: str | None = None
    description: str | None = None

    def parse(self, value: Any, where: str) -> Any:
        """The value, checked and converted; raises :class:`~dibs.InvalidInput` naming ``where``."""
        raise TypeError(f"{type(self).__name__} describes answers; it parses nothing")

    def body(self, components: Components) -> Json:
        """The JSON Schema of the value itself (never a ``$ref`` to it)."""
        raise NotImplementedError

    def named(self, name: str, description: str | None = None) -> Schema:
        """This schema as the component ``name``."""
        self.name = name
        if description is not None:
            self.description = description
        return self


class Components:
    """Renders schemas, collecting the named ones for ``#/components/schemas``."""

    def __init__(self) -> None:
        self.schemas: dict[str, Json] = {}
        self._seen: dict[str, Schema] = {}

    def render(self, schema: Schema) -> Json:
        """``schema`` as JSON Schema: a ``$ref`` if it is named, else inline."""
        if schema.name is None:
            return self._described(schema, schema.body(self))
        seen = self._seen.setdefault(schema.name, schema)
        if seen is not schema:
            raise ValueError(f"two schemas are named {schema.name}")
        if schema.name not in self.schemas:
            self.schemas[schema.name] = {}  # placeholder: a schema may refer to itself
            self.schemas[schema.name] = self._described(schema, schema.body(self))
        return {"$ref": f"#/components/schemas/{schema.name}"}

    @staticmethod
    def _described(schema: Schema, rendered: Json) -> Json:
        if schema.description is not None:
            rendered = {**rendered, "description": schema.description}
        return rendered


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


# --- scalars ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Text(Schema):
    """A string: its length, the characters it may not hold, a prefix it may not start with.

    ``forbidden`` is a regex character class (without brackets); the pattern
    renders it. Lone surrogates are refused too (no UTF-8 store can keep them),
    a rule ECMA-262 patterns cannot state portably: :class:`Unstated`.
    """

    min_length: int = 0
    max_length: int | None = None
    forbidden: str | None = None
    reserved: str | None = None
    format: str | None = None
    pattern: str | None = None
    """A pattern to render only (the values are the service's own), e.g. for answers."""
    message: str = "{where} must be a string"
    reserved_message: str = "{where}: names starting with {reserved!r} are reserved"
    description: str | None = None
    examples: tuple[str, ...] = ()
    default: str | None = None

    def __post_init__(self) -> None:
        self._bad = (
            None
            if self.forbidden is None
            else re.compile(f"[{self.forbidden}\\ud800-\\udfff]")  # one search on the happy path
        )
        self._rendered_bad = None if self.forbidden is None else re.compile(f"[{self.forbidden}]")

    def parse(self, value: Any, where: str) -> str:
        if (
            not isinstance(value, str)
            or len(value) < self.min_length
            or (self.max_length is not None and len(value) > self.max_length)
        ):
            raise InvalidInput(self.message.format(where=where), field=where, value=None)
        if self._bad is not None and self._bad.search(value) is not None:
            assert self._rendered_bad is not None
            unstated = self._rendered_bad.search(value) is None  # only a lone surrogate
            error = Unstated if unstated else InvalidInput
            raise error(self.message.format(where=where), field=where, value=None)
        if self.reserved is not None and value.startswith(self.reserved):
            raise InvalidInput(
                self.reserved_message.format(where=where, reserved=self.reserved),
                field=where,
                value=None,
            )
        return value

    def body(self, components: Components) -> Json:
        out: Json = {"type": "string"}
        if self.format is not None:
            out["format"] = self.format
        if self.min_length:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        if self.forbidden is not None:
            out["pattern"] = f"^[^{self.forbidden}]*$"
        elif self.pattern is not None:
            out["pattern"] = self.pattern
        if self.reserved is not None:
            out["not"] = {"pattern": "^" + re.escape(self.reserved)}
        if self.default is not None:
            out["default"] = self.default
        if self.examples:
            out["examples"] = list(self.examples)
        return out


@dataclass(eq=False)
class Number(Schema):
    """A JSON number in ``[minimum, maximum]`` (never a boolean); ``None`` too if ``nullable``."""

    minimum: float
    maximum: float
    nullable: bool = False
    message: str = "{where} must be a number from {minimum:g} to {maximum}"
    description: str | None = None

    def parse(self, value: Any, where: str) -> float | None:
        if value is None and self.nullable:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            # Compare before any float conversion: a huge int is simply out of range.
            or not self.minimum <= value <= self.maximum
        ):
            text = self.message.format(where=where, minimum=self.minimum, maximum=self.maximum)
            raise InvalidInput(
                text + (", or null" if self.nullable else ""), field=where, value=None
            )
        return float(value)

    def body(self, components: Components) -> Json:
        return {
            "type": ["number", "null"] if self.nullable else "number",
            "minimum": self.minimum,
            "maximum": self.maximum,
        }


@dataclass(eq=False)
class Integer(Schema):
    """A JSON integer (not ``5.0``: :class:`Unstated`; not a boolean) in ``[minimum, maximum]``.

    A ``maximum`` that is ``stated=False`` is enforced but not rendered (it is
    the service's configuration, e.g. a lot's size): :class:`Unstated`.
    """

    minimum: int | None = None
    maximum: int | None = None
    stated: bool = True
    message: str = "{where} must be an integer"
    default: int | None = None
    description: str | None = None

    def parse(self, value: Any, where: str) -> int:
        if isinstance(value, float) and value.is_integer():
            # 5.0 is the integer 5 to JSON Schema; a fence or a length is written 5.
            raise Unstated(self._message(where), field=where, value=None)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (self.minimum is not None and value < self.minimum)
        ):
            raise InvalidInput(self._message(where), field=where, value=None)
        if self.maximum is not None and value > self.maximum:
            error = InvalidInput if self.stated else Unstated
            raise error(self._message(where), field=where, value=None)
        return value

    def _message(self, where: str) -> str:
        return self.message.format(where=where, minimum=self.minimum, maximum=self.maximum)

    def body(self, components: Components) -> Json:
        out: Json = {"type": "integer"}
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None and self.stated:
            out["maximum"] = self.maximum
        if self.default is not None:
            out["default"] = self.default
        return out


@dataclass(eq=False)
class Boolean(Schema):
    """``true`` or ``false`` (answers only)."""

    description: str | None = None

    def body(self, components: Components) -> Json:
        return {"type": "boolean"}


@dataclass(eq=False)
class Const(Schema):
    """Exactly one value (answers only)."""

    value: Any
    description: str | None = None

    def body(self, components: Components) -> Json:
        return {"const": self.value}


@dataclass(eq=False)
class Enum(Schema):
    """One of a few strings (answers only)."""

    values: tuple[str, ...]
    description: str | None = None

    def body(self, components: Components) -> Json:
        return {"enum": list(self.values)}


@dataclass(eq=False)
class Choice(Schema):
    """One of a few strings, in a request: anything else is refused, naming the choices."""

    values: tuple[str, ...]
    description: str | None = None

    def parse(self, value: Any, where: str) -> Any:
        if type(value) is str and value in self.values:
            return value
        raise InvalidInput(
            f"{where} must be one of {', '.join(map(repr, self.values))}", field=where, value=value
        )

    def body(self, components: Components) -> Json:
        return {"type": "string", "enum": list(self.values)}


@dataclass(eq=False)
class Raw(Schema):
    """A JSON Schema as is, for what the service itself makes (never a request's value)."""

    schema: Json
    description: str | None = None

    def body(self, components: Components) -> Json:
        return dict(self.schema)


# --- composites ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Nullable(Schema):
    """``inner``, or ``null`` (answers only)."""

    inner: Schema
    description: str | None = None

    def body(self, components: Components) -> Json:
        inner = components.render(self.inner)
        kind = inner.get("type")
        if isinstance(kind, str) and set(inner) <= {"type", "format", "description"}:
            return {**inner, "type": [kind, "null"]}
        return {"oneOf": [inner, {"type": "null"}]}


@dataclass(eq=False)
class OneOf(Schema):
    """Exactly one of ``choices`` (answers only; a request's union parses itself)."""

    choices: tuple[Schema, ...]
    description: str | None = None

    def body(self, components: Components) -> Json:
        return {"oneOf": [components.render(c) for c in self.choices]}


@dataclass(eq=False)
class Array(Schema):
    """A list of ``min_items`` to ``max_items`` values of ``items``."""

    items: Schema
    min_items: int = 0
    max_items: int | None = None
    message: str = "{where} must be a list"
    description: str | None = None

    def parse(self, value: Any, where: str) -> list[Any]:
        if (
            not isinstance(value, list)
            or len(value) < self.min_items
            or (self.max_items is not None and len(value) > self.max_items)
        ):
            text = self.message.format(where=where, min=self.min_items, max=self.max_items)
            raise InvalidInput(text, field=where, value=None)
        parse = self.items.parse
        return [parse(item, f"{where}[{i}]") for i, item in enumerate(value)]

    def body(self, components: Components) -> Json:
        out: Json = {"type": "array", "items": components.render(self.items)}
        if self.min_items:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out


@dataclass(eq=False)
class MapOf(Schema):
    """An object whose every member is a ``values`` (answers only)."""

    values: Schema
    description: str | None = None

    def body(self, components: Components) -> Json:
        return {"type": "object", "additionalProperties": components.render(self.values)}


_ABSENT: Any = object()


@dataclass(frozen=True)
class Prop:
    """A member of an :class:`Obj`: its schema, whether it must be there, its default."""

    schema: Schema
    required: bool = True
    default: Any = _ABSENT
    """What an absent member parses as; without one, absent parses like ``null``."""


def _props(members: Mapping[str, Schema | Prop]) -> dict[str, Prop]:
    return {k: v if isinstance(v, Prop) else Prop(v) for k, v in members.items()}


class Obj(Schema):
    """A JSON object of named members; no other member is allowed unless ``closed=False``.

    Parsing checks for an unknown member first, then each member in order,
    and returns a dict of the parsed members (absent optional ones without a
    default are left out).
    """

    def __init__(
        self,
        members: Mapping[str, Schema | Prop],
        *,
        name: str | None = None,
        description: str | None = None,
        closed: bool = True,
        after: Callable[[dict[str, Any], str], None] | None = None,
    ) -> None:
        self.members = _props(members)
        self.after = after
        self.name = name
        self.description = description
        self.closed = closed
        self._keys = frozenset(self.members)
        self._order = tuple(
            (key, prop.schema.parse, prop.default if prop.default is not _ABSENT else None)
            for key, prop in self.members.items()
        )
        self._optional = frozenset(
            k for k, p in self.members.items() if not p.required and p.default is _ABSENT
        )

    def unknown(self, value: dict[str, Any], where: str) -> None:
        """Raise naming the first member of ``value`` (in sorted order) that is not ours."""
        if self.closed and not self._keys.issuperset(value):
            name = min(set(value) - self._keys)
            text = json.dumps(name)
            raise InvalidInput(
                f"{where} has an unknown field {text}" if where else f"unknown field {text}",
                field=_join(where, name),
                value=None,
            )

    def parse(self, value: Any, where: str = "") -> dict[str, Any]:
        if not isinstance(value, dict):
            raise InvalidInput(f"{where or 'the body'} must be an object", field=where, value=None)
        self.unknown(value, where)
        out: dict[str, Any] = {}
        for key, parse, default in self._order:
            if key in value:
                out[key] = parse(value[key], _join(where, key))
            elif key not in self._optional:
                out[key] = parse(default, _join(where, key))
        if self.after is not None:
            self.after(out, where)
        return out

    def body(self, components: Components) -> Json:
        out: Json = {
            "type": "object",
            "properties": {k: components.render(p.schema) for k, p in self.members.items()},
            "required": [k for k, p in self.members.items() if p.required],
        }
        if not out["required"]:
            del out["required"]
        if self.closed:
            out["additionalProperties"] = False
        return out


def examples(schema: Text, names: Iterable[str]) -> Text:
    """A copy of a path parameter's schema that lists this service's names as examples."""
    names = tuple(names)
    return dataclasses.replace(schema, examples=names) if names else schema
