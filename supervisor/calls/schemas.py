"""Tool schemas as each LLM provider wants them, and validation of call arguments.

The catalog holds plain JSON Schema (draft 2020-12). `adapt_schema` rewrites one for a
provider and `declaration` wraps it in that provider's tool entry. Call arguments are always
validated against the catalog's schema, never an adapted one. So where a provider cannot
express a schema, the adaptation narrows rather than widens it (what a model sends under
the adapted schema still passes validation) and says in the description what it left out.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeGuard

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

__all__ = ["ArgumentError", "SchemaFormat", "adapt_schema", "declaration", "validate_arguments"]


class SchemaFormat(enum.StrEnum):
    JSON_SCHEMA = "json"
    """Plain JSON Schema (draft 2020-12), as in the catalog."""
    OPENAI = "openai"
    """OpenAI function calling (Chat Completions `tools` entries)."""
    ANTHROPIC = "anthropic"
    """Anthropic Messages API `tools` entries."""
    GEMINI = "gemini"
    """Gemini function declarations (a subset of OpenAPI 3.0 Schema)."""


_TOOL_NAME: Final[Mapping[SchemaFormat, re.Pattern[str]]] = {
    SchemaFormat.OPENAI: re.compile(r"[a-zA-Z0-9_-]{1,64}"),
    SchemaFormat.ANTHROPIC: re.compile(r"[a-zA-Z0-9_-]{1,64}"),
    SchemaFormat.GEMINI: re.compile(r"[a-zA-Z_][a-zA-Z0-9_.-]{0,63}"),
}


def declaration(
    name: str, description: str, parameters: Mapping[str, Any], fmt: SchemaFormat
) -> dict[str, Any]:
    """The tool as that provider wants it in a request.

    json: {name, description, parameters}; openai: {type: "function", function: {name,
    description, parameters}}; anthropic: {name, description, input_schema}; gemini: {name,
    description, parameters}, without `parameters` when the tool takes none (Gemini refuses
    an OBJECT without properties). Raises ValueError for a name the provider refuses and
    for an unknown format (as adapt_schema does).
    """
    fmt = SchemaFormat(fmt)
    rule = _TOOL_NAME.get(fmt)
    if rule is not None and not rule.fullmatch(name):
        raise ValueError(f"tool name {name!r} is not accepted by {fmt}")
    schema = adapt_schema(parameters, fmt)
    match fmt:
        case SchemaFormat.OPENAI:
            function = {"name": name, "description": description, "parameters": schema}
            return {"type": "function", "function": function}
        case SchemaFormat.ANTHROPIC:
            return {"name": name, "description": description, "input_schema": schema}
        case SchemaFormat.GEMINI if not schema.get("properties"):
            return {"name": name, "description": description}
        case _:
            return {"name": name, "description": description, "parameters": schema}


def adapt_schema(schema: Mapping[str, Any], fmt: SchemaFormat) -> dict[str, Any]:
    """A new JSON-ready schema for that provider; `schema` is not changed.

    openai: top-level `type: "object"` and `properties`; no `$schema`/`$id`; a top-level
    allOf/anyOf/oneOf is merged into one object (OpenAI refuses them there); an array
    schema without `items` gets `items: {}` (any item, as before; OpenAI answers "array
    schema missing items" otherwise).
    anthropic: the full schema with top-level `type: "object"`, without `$schema`; a
    top-level allOf/anyOf/oneOf is merged as for openai (Anthropic answers "input_schema
    does not support oneOf, allOf, or anyOf at the top level").
    gemini: the OpenAPI 3.0 subset Gemini accepts; see `_Gemini`.
    """
    plain: dict[str, Any] = _plain(schema)
    match SchemaFormat(fmt):
        case SchemaFormat.JSON_SCHEMA:
            return plain
        case SchemaFormat.OPENAI:
            root = _object_root(plain)
            _with_items(root)
            return root
        case SchemaFormat.ANTHROPIC:
            return _object_root(plain)
        case SchemaFormat.GEMINI:
            return _Gemini(plain).parameters()


def _plain(value: Any) -> Any:
    """A deep copy made of dicts and lists only, as json.dumps wants it."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _merge(schemas: Iterable[Mapping[str, Any]], *, union: bool = False) -> dict[str, Any]:
    """Several object schemas as one: properties united (a property given differently twice
    becomes allOf, or anyOf for a union, of both); `required` united, or for a union only
    what every alternative requires; enums intersected; descriptions joined; otherwise the
    first schema that has a keyword wins."""
    out: dict[str, Any] = {}
    required: list[list[str]] = []
    for schema in schemas:
        required.append(list(schema.get("required", [])))
        for key, value in schema.items():
            if key not in out or key == "required":
                out[key] = value
            elif key == "properties":
                props = out[key] = dict(out[key])
                for name, sub in value.items():
                    old = props.setdefault(name, sub)
                    if old != sub:
                        props[name] = {"anyOf" if union else "allOf": [old, sub]}
            elif key == "description" and value != out[key]:
                out[key] = f"{out[key]} {value}"
            elif key == "enum":
                out[key] = [v for v in out[key] if v in value]
    names = [n for r in required for n in r if not union or all(n in o for o in required)]
    out.pop("required", None)
    if names:
        out["required"] = list(dict.fromkeys(names))
    return out


def _object_root(schema: dict[str, Any]) -> dict[str, Any]:
    """The root as one object schema: combinators merged, nothing but an object allowed."""
    for key in ("$schema", "$id", "enum", "const", "not"):
        schema.pop(key, None)
    parts = [_resolve_local(schema, part) for part in schema.pop("allOf", [])]
    schema = _merge([schema, *parts])
    alternatives = [*schema.pop("anyOf", []), *schema.pop("oneOf", [])]
    if alternatives:
        variants = [_resolve_local(schema, alt) for alt in alternatives]
        schema = _merge([schema, _merge(variants, union=True)])
    schema.setdefault("properties", {})
    return {**schema, "type": "object"}


_SUBSCHEMA_MAPS: Final = (
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
)
_SUBSCHEMA_LISTS: Final = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE: Final = (
    "items", "additionalProperties", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip


def _children(node: Mapping[str, Any]) -> list[Any]:
    """The subschemas of a schema object (not property names that look like keywords)."""
    subs = [node[key] for key in _SUBSCHEMA_ONE if key in node]
    subs += [s for key in _SUBSCHEMA_LISTS if isinstance(node.get(key), list) for s in node[key]]
    subs += [
        s for key in _SUBSCHEMA_MAPS if isinstance(node.get(key), dict) for s in node[key].values()
    ]
    return subs


def _with_items(node: Any) -> None:
    """Give every array schema in `node` (changed in place) that has no `items` `items: {}`."""
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if (kind == "array" or (isinstance(kind, list) and "array" in kind)) and "items" not in node:
        node["items"] = {}
    for sub in _children(node):
        _with_items(sub)


def reference_problems(schema: Mapping[str, Any]) -> list[str]:
    """Why `schema`'s references cannot be followed: a `$ref` that is not a pointer into the
    schema itself (no other document is ever fetched), or an `$id` below the root (it would
    move the base such pointers start from). Empty when there is nothing wrong."""
    problems, stack = [], [(schema, True)]
    while stack:
        node, top = stack.pop()
        if not isinstance(node, Mapping):
            continue
        if "$id" in node and not top:
            problems.append("$id is allowed at the top only")
        for key in ("$ref", "$dynamicRef"):
            if key in node and _pointer(schema, node[key]) is None:
                problems.append(f"{key} {node[key]!r} points nowhere in the schema")
        stack.extend((sub, False) for sub in _children(node))
    return problems


def _resolve_local(root: Mapping[str, Any], node: Any) -> dict[str, Any]:
    """`node` itself, or the local definition its `$ref` points to (siblings win)."""
    if not isinstance(node, dict):
        return {}
    target = _pointer(root, node.get("$ref"))
    rest = {k: v for k, v in node.items() if k != "$ref"}
    return {**target, **rest} if isinstance(target, dict) else rest


def _pointer(root: Any, ref: Any) -> Any:
    """The value a same-document `$ref` ("#", "#/$defs/x") points to, or None."""
    if not isinstance(ref, str) or not ref.startswith("#") or (ref != "#" and ref[1] != "/"):
        return None
    node = root
    for token in ref[2:].split("/") if ref != "#" else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


# --- Gemini ---------------------------------------------------------------------------------

_GEMINI_FORMATS: Final = {
    "string": {"enum", "date-time"},
    "integer": {"int32", "int64"},
    "number": {"float", "double"},
}
_KEEP: Final = {
    "string": ("minLength", "maxLength", "pattern"),
    "integer": ("minimum", "maximum"),
    "number": ("minimum", "maximum"),
    "array": ("minItems", "maxItems"),
}
_UNIONS: Final = ("anyOf", "oneOf")
_MAX_DEPTH: Final = 32
_MAX_REF_REPEAT: Final = 2
"""How often one `$ref` may be expanded on a path before a recursive schema is cut there."""

_Expanded: TypeAlias = tuple[dict[str, Any], tuple[str, ...]]


class _Gemini:
    """Rewrites JSON Schema into the OpenAPI 3.0 subset of Gemini function declarations.

    `$ref` is inlined (a recursive one is cut after `_MAX_REF_REPEAT` expansions), allOf is
    merged, anyOf/oneOf are flattened: null alternatives become `nullable`, enum alternatives
    one enum, otherwise the first object (or any-value) alternative is kept, with a note.
    `const` becomes a one-value enum; a list of types, its first non-null type. A string
    enum stays an enum; numbers and booleans keep their type and list the allowed values
    in the description (a string enum would make Gemini send "1", which validation of the
    catalog schema rejects); mixed enums become strings. Gemini also refuses an OBJECT
    without properties and an ARRAY without items, so a free-form map is left out of its
    parent (with a note) and a value of any type is offered as a string.
    """

    def __init__(self, root: dict[str, Any]) -> None:
        self._root = root

    def parameters(self) -> dict[str, Any]:
        out = self._clean(self._root, (), 0)
        if out is None or out["type"] != "OBJECT":
            described = {"description": d} if (d := self._root.get("description")) else {}
            return {"type": "OBJECT", **described}
        return out

    def _expand(self, node: Any, refs: tuple[str, ...]) -> _Expanded | None:
        """`node` with `$ref` inlined and allOf merged at its top; None if nothing can match
        (a false schema) or a recursive reference is cut."""
        if node is True:
            return {}, refs
        if not isinstance(node, dict):
            return None
        while "$ref" in node:
            ref = node["$ref"]
            if refs.count(ref) >= _MAX_REF_REPEAT:
                return None
            node, refs = _resolve_local(self._root, node), (*refs, ref)
        if "allOf" in node:
            parts = [self._expand(part, refs) for part in node["allOf"]]
            if any(part is None for part in parts):
                return None
            rest = {k: v for k, v in node.items() if k != "allOf"}
            expanded = [p for p in parts if p is not None]
            refs = (*refs, *(r for _, part_refs in expanded for r in part_refs[len(refs) :]))
            return self._expand(_merge([rest, *(p for p, _ in expanded)]), refs)
        return node, refs

    def _clean(self, node: Any, refs: tuple[str, ...], depth: int) -> dict[str, Any] | None:
        """The Gemini schema for `node`, or None if Gemini cannot express any of it."""
        expanded = self._expand(node, refs) if depth <= _MAX_DEPTH else None
        if expanded is None:
            return None
        node, refs = expanded
        if any(key in node for key in _UNIONS):
            return self._union(node, refs, depth)
        notes: list[str] = []
        kind, nullable, values = _gemini_type(node, notes)
        if kind is None:
            return None
        out: dict[str, Any] = {"type": kind.upper()}
        if values is not None:
            out["enum"] = values
        if kind == "object":
            if not self._object(node, out, notes, refs, depth):
                return None
        elif kind == "array":
            items = self._clean(node.get("items", True), refs, depth + 1)
            if items is None:
                return None
            out["items"] = items
        _constraints(node, kind, out, notes)
        if nullable:
            out["nullable"] = True
        if isinstance(title := node.get("title"), str):
            out["title"] = title
        _describe(out, node.get("description"), notes)
        return out

    def _object(
        self,
        node: dict[str, Any],
        out: dict[str, Any],
        notes: list[str],
        refs: tuple[str, ...],
        depth: int,
    ) -> bool:
        props: dict[str, Any] = {}
        for name, sub in node.get("properties", {}).items():
            cleaned = self._clean(sub, refs, depth + 1)
            if cleaned is None:
                notes.append(f"Argument {name!r} cannot be given here.")
            else:
                props[name] = cleaned
        if not props:
            return False
        out["properties"] = props
        required = [name for name in node.get("required", []) if name in props]
        if required:
            out["required"] = required
        return True

    def _union(
        self, node: dict[str, Any], refs: tuple[str, ...], depth: int
    ) -> dict[str, Any] | None:
        alternatives = self._alternatives(node, refs)
        nullable = any(_is_null(alt) for alt, _ in alternatives)
        alternatives = [(alt, r) for alt, r in alternatives if not _is_null(alt)]
        if not alternatives:
            return None
        note = None
        if all("enum" in alt or "const" in alt for alt, _ in alternatives):
            values = [v for alt, _ in alternatives for v in alt.get("enum", [alt.get("const")])]
            candidates: list[_Expanded] = [({"enum": list(_unique(values))}, refs)]
        else:
            preferred = [a for a in alternatives if _json_schema_type(a[0]) in ("object", None)]
            candidates = preferred + [a for a in alternatives if a not in preferred]
            if len(alternatives) > 1:
                note = f"Only one of {len(alternatives)} accepted forms is described here."
        cleaned = (self._clean(alt, alt_refs, depth + 1) for alt, alt_refs in candidates)
        out = next((c for c in cleaned if c is not None), None)
        if out is None:
            return None
        if nullable:
            out["nullable"] = True
        if isinstance(title := node.get("title"), str):
            out["title"] = title
        base = node.get("description")
        description = out.pop("description", None)
        notes = [n for n in (description if description != base else None, note) if n]
        _describe(out, base, notes)
        return out

    def _alternatives(self, node: dict[str, Any], refs: tuple[str, ...]) -> list[_Expanded]:
        """The alternatives of a (nested) anyOf/oneOf, each merged with the keywords beside
        the union; anyOf is used if both are given."""
        base = {k: v for k, v in node.items() if k not in (*_UNIONS, "description", "title")}
        out: list[_Expanded] = []
        for alt in node.get("anyOf") or node.get("oneOf") or []:
            expanded = self._expand(alt, refs)
            if expanded is None:
                continue
            merged = _merge([expanded[0], base])
            if any(key in merged for key in _UNIONS):
                out.extend(self._alternatives(merged, expanded[1]))
            else:
                out.append((merged, expanded[1]))
        return out


_GeminiType: TypeAlias = tuple[str | None, bool, list[str] | None]


def _gemini_type(node: Mapping[str, Any], notes: list[str]) -> _GeminiType:
    """The one JSON type Gemini is told (None if only null is allowed), whether null is
    allowed too, and the string enum if any (`const` is a one-value enum)."""
    declared = node.get("type")
    types = [declared] if isinstance(declared, str) else list(declared or [])
    nullable = "null" in types
    types = [t for t in types if t != "null"]
    if len(types) > 1:
        also = " or ".join(_ARTICLE.get(t, str(t)) for t in types[1:])
        notes.append(f"The tool also accepts {also}.")
    if "enum" in node or "const" in node:
        values = list(node["enum"]) if "enum" in node else [node["const"]]
        nullable = nullable or None in values
        values = [v for v in values if v is not None]
        if not values:
            return None, nullable, None
        enum_kind, strings = _enum(values, types, notes)
        return enum_kind, nullable, strings
    if declared is not None and not types:
        return None, nullable, None
    kind: str | None = types[0] if types else _json_schema_type(node)
    if kind is None:
        notes.append("Any JSON value, given here as a string.")
    return kind or "string", nullable, None


def _enum(values: list[Any], types: list[str], notes: list[str]) -> tuple[str, list[str] | None]:
    """Gemini takes string enums only. Numbers and booleans keep their type, with the values
    in a note; a mix of kinds becomes a string enum of JSON texts."""
    kinds = {_json_type(v) for v in values}
    if kinds == {"string"}:
        return "string", values
    shown = ", ".join(_quote(v) for v in values)
    if kinds <= {"integer", "number"} or kinds == {"boolean"}:
        notes.append(f"One of: {shown}.")
        kind = "number" if "number" in kinds else next(iter(kinds))
        return (types[0] if types and types[0] in ("integer", "number") else kind), None
    notes.append(f"Values are written here as strings; the tool expects one of: {shown}.")
    return "string", [v if isinstance(v, str) else json.dumps(v) for v in values]


def _constraints(node: dict[str, Any], kind: str, out: dict[str, Any], notes: list[str]) -> None:
    for key in _KEEP.get(kind, ()):
        if key in node:
            out[key] = node[key]
    if kind in ("integer", "number"):
        _bounds(node, kind, out, notes)
        if "multipleOf" in node:
            notes.append(f"Must be a multiple of {_quote(node['multipleOf'])}.")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in _GEMINI_FORMATS.get(kind, ()):
        out["format"] = fmt
    elif isinstance(fmt, str):
        notes.append(f"Format: {fmt}.")
    if node.get("uniqueItems") is True:
        notes.append("Items must be unique.")
    if "default" in node:
        notes.append(f"Default: {_quote(node['default'])}.")


def _bounds(node: dict[str, Any], kind: str, out: dict[str, Any], notes: list[str]) -> None:
    """exclusiveMinimum/Maximum as minimum/maximum: exact for integers, else with a note."""
    low, high = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if _is_number(low):
        edge: float = math.floor(low) + 1 if kind == "integer" else low
        out["minimum"] = max(out.get("minimum", edge), edge)
        if kind != "integer":
            notes.append(f"Must be greater than {_quote(low)}.")
    if _is_number(high):
        edge = math.ceil(high) - 1 if kind == "integer" else high
        out["maximum"] = min(out.get("maximum", edge), edge)
        if kind != "integer":
            notes.append(f"Must be less than {_quote(high)}.")


def _describe(out: dict[str, Any], description: Any, notes: Sequence[str]) -> None:
    text = " ".join(p for p in (description if isinstance(description, str) else "", *notes) if p)
    if text:
        out["description"] = text


def _json_schema_type(node: Mapping[str, Any]) -> str | None:
    """The type a schema without `type` implies by its keywords; None for any value."""
    declared = node.get("type")
    if isinstance(declared, str):
        return declared
    for kind, keys in (
        ("object", ("properties", "additionalProperties", "patternProperties", "required")),
        ("array", ("items", "prefixItems", "minItems", "maxItems")),
        ("string", ("minLength", "maxLength", "pattern")),
        ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")),
    ):
        if any(key in node for key in keys):
            return kind
    return None


def _is_null(node: Mapping[str, Any]) -> bool:
    if "const" in node and node["const"] is None:
        return True
    return node.get("type") in ("null", ["null"]) or node.get("enum") == [None]


def _unique(values: Iterable[Any]) -> Iterable[Any]:
    seen: list[Any] = []
    for value in values:
        if not any(value == s and type(value) is type(s) for s in seen):
            seen.append(value)
            yield value


# --- Validation -----------------------------------------------------------------------------


class ArgumentError(ValueError):
    """Call arguments that do not match the tool's schema.

    `field` is the dotted path of the failing argument ("env.HOME"), "" for the arguments
    object itself; str(exc) names it and never quotes more than ~100 characters of a value.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


_CACHE_SIZE: Final = 256
_MAX_ERRORS: Final = 100
"""Errors looked at to pick the most relevant one; a huge wrong array yields millions."""
_QUOTE_LIMIT: Final = 100
_validators: dict[int, tuple[Mapping[str, Any], Validator]] = {}


_Keyword: TypeAlias = Callable[[Validator, Any, Any, Any], Iterator[ValidationError]]


def _short(kind: str, fails: Callable[[Any, Any], bool]) -> _Keyword:
    def keyword(
        validator: Validator, value: Any, instance: Any, _: Any
    ) -> Iterator[ValidationError]:
        if validator.is_type(instance, kind) and fails(instance, value):
            yield ValidationError("see _argument_error")

    return keyword


def _type(validator: Validator, types: Any, instance: Any, _: Any) -> Iterator[ValidationError]:
    if not any(validator.is_type(instance, t) for t in _listed(types)):
        yield ValidationError("see _argument_error")


_Draft202012: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        "type": _type,
        "minLength": _short("string", lambda s, n: len(s) < n),
        "maxLength": _short("string", lambda s, n: len(s) > n),
        "pattern": _short("string", lambda s, regex: not re.search(regex, s)),
        "minimum": _short("number", lambda x, bound: x < bound),
        "maximum": _short("number", lambda x, bound: x > bound),
        "exclusiveMinimum": _short("number", lambda x, bound: x <= bound),
        "exclusiveMaximum": _short("number", lambda x, bound: x >= bound),
    },
)
"""Draft 2020-12 with the keywords a huge string or number most likely fails replaced by
the same checks without jsonschema's messages, which hold repr(instance): ~20 ms and 20 MB
for a 10 MB string (and an error for an int over 4300 digits). enum and const keep theirs.
Our messages come from `_argument_error`."""


def validate_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> None:
    """Raise ArgumentError for the most relevant violation of `schema` by `arguments`:
    the shallowest one, and at one depth a missing argument before an unexpected one
    before a wrong type. The schema must not change once used here: its compiled
    validator is cached by identity. An invalid schema raises jsonschema.SchemaError."""
    instance: Any = arguments
    if isinstance(arguments, Mapping) and not isinstance(arguments, dict):
        instance = dict(arguments)
    best: ValidationError | None = None
    for count, error in enumerate(_validator(schema).iter_errors(instance)):
        if best is None or _relevance(error) > _relevance(best):
            best = error
        if count + 1 >= _MAX_ERRORS:
            break
    if best is not None:
        raise _argument_error(best)


def _validator(schema: Mapping[str, Any]) -> Validator:
    entry = _validators.get(id(schema))
    if entry is not None and entry[0] is schema:
        return entry[1]
    plain = _plain(schema)
    Draft202012Validator.check_schema(plain)
    validator = _Draft202012(plain)
    if len(_validators) >= _CACHE_SIZE:
        _validators.pop(next(iter(_validators)), None)
    _validators[id(schema)] = (schema, validator)  # holding `schema` keeps its id unique
    return validator


_RANK: Final = {"required": 4, "dependentRequired": 4, "additionalProperties": 3, "type": 2}


def _relevance(error: ValidationError) -> tuple[int, int]:
    weak = error.validator in _UNIONS
    return -len(error.path), -1 if weak else _RANK.get(str(error.validator), 1)


_ARTICLE: Final = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}
_COMPARISON: Final = {
    "minimum": ">=",
    "exclusiveMinimum": ">",
    "maximum": "<=",
    "exclusiveMaximum": "<",
}
_COUNTS: Final = {
    "minLength": "must be at least {} characters long",
    "maxLength": "must be at most {} characters long",
    "minItems": "must have at least {} items",
    "maxItems": "must have at most {} items",
    "minProperties": "must have at least {} entries",
    "maxProperties": "must have at most {} entries",
}


def _argument_error(error: ValidationError) -> ArgumentError:
    path = [str(p) for p in error.path]
    keyword = str(error.validator)
    expected: Any = error.validator_value
    value: Any = error.instance
    schema: Any = error.schema
    if keyword in ("required", "dependentRequired"):
        names = expected if keyword == "required" else _dependent(expected, value)
        field = ".".join([*path, next((n for n in names if n not in value), "?")])
        return ArgumentError(field, f"missing required argument {_quote(field)}")
    if keyword == "additionalProperties":
        field = ".".join([*path, _extra(schema, value)])
        return ArgumentError(field, f"unexpected argument {_quote(field)}")
    field = ".".join(path)
    subject = f"argument {_quote(field)}" if path else "arguments"
    if error.validator is None:  # a false schema; jsonschema gives it no path
        return ArgumentError(field, f"{subject}: a value is not allowed")
    return ArgumentError(field, f"{subject} {_complaint(keyword, expected, value, error)}")


def _complaint(keyword: str, expected: Any, value: Any, error: ValidationError) -> str:
    got = _json_type(value)
    if keyword == "type":
        return f"must be {_types(expected)}, got {got}"
    if keyword in _UNIONS:
        types = [e.validator_value for e in error.context or () if e.validator == "type"]
        if types and len(types) == len(error.context or ()):
            return f"must be {_types([t for ts in types for t in _listed(ts)])}, got {got}"
        return (
            "matched more than one accepted form"
            if error.context == []
            else "matched no accepted form"
        )
    if keyword == "enum":
        shown = ", ".join(_quote(v) for v in expected[:10]) + (
            ", ..." if len(expected) > 10 else ""
        )
        return f"must be one of {shown}, got {_quote(value)}"
    if keyword == "const":
        return f"must be {_quote(expected)}, got {_quote(value)}"
    if keyword in _COMPARISON:
        return f"must be {_COMPARISON[keyword]} {_quote(expected)}, got {_quote(value)}"
    if keyword in _COUNTS:
        size = len(value) if isinstance(value, str | list | dict) else "?"
        return f"{_COUNTS[keyword].format(expected)}, got {size}"
    if keyword == "pattern":
        return f"must match the pattern {_quote(expected)}"
    if keyword == "multipleOf":
        return f"must be a multiple of {_quote(expected)}, got {_quote(value)}"
    if keyword == "uniqueItems":
        return "must not contain duplicate items"
    return f"failed the {keyword!r} check"


def _dependent(expected: Mapping[str, Sequence[str]], instance: Mapping[str, Any]) -> list[str]:
    return [n for key, names in expected.items() if key in instance for n in names]


def _extra(schema: Mapping[str, Any], instance: Mapping[str, Any]) -> str:
    known, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    return next(
        (k for k in instance if k not in known and not any(re.search(p, k) for p in patterns)),
        "?",
    )


def _listed(types: Any) -> list[str]:
    return [types] if isinstance(types, str) else list(types)


def _types(types: Any) -> str:
    return " or ".join(_ARTICLE.get(t, str(t)) for t in _unique(_listed(types)))


def json_type_phrase(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words with an article ("an array", "null")."""
    kind = _json_type(value)
    return _ARTICLE.get(kind, f"a {kind}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _quote(value: Any) -> str:
    """A value for a message: strings quoted and cut at _QUOTE_LIMIT, containers by type."""
    if isinstance(value, str):
        short = value if len(value) <= _QUOTE_LIMIT else value[:_QUOTE_LIMIT] + "..."
        return repr(short)
    if isinstance(value, int) and abs(value).bit_length() > 3 * _QUOTE_LIMIT:
        return "<integer>"  # too long to show; str() refuses ints over 4300 digits anyway
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return f"<{_json_type(value)}>"
