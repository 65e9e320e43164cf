"""Tool schemas for Gemini: JSON Schema rewritten into the OpenAPI 3.0 subset of Gemini
function declarations, narrowing where Gemini cannot express a schema and saying so."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias

from stockade.supervisor.tools.phrasing import ARTICLE, is_number, json_type, quote, unique
from stockade.supervisor.tools.schema_tree import UNIONS, merge, resolve_local


def gemini_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The Gemini `parameters` for a plain JSON Schema (see `_Gemini`)."""
    return _Gemini(schema).parameters()


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
            node, refs = resolve_local(self._root, node), (*refs, ref)
        if "allOf" in node:
            parts = [self._expand(part, refs) for part in node["allOf"]]
            if any(part is None for part in parts):
                return None
            rest = {k: v for k, v in node.items() if k != "allOf"}
            expanded = [p for p in parts if p is not None]
            refs = (*refs, *(r for _, part_refs in expanded for r in part_refs[len(refs) :]))
            return self._expand(merge([rest, *(p for p, _ in expanded)]), refs)
        return node, refs

    def _clean(self, node: Any, refs: tuple[str, ...], depth: int) -> dict[str, Any] | None:
        """The Gemini schema for `node`, or None if Gemini cannot express any of it."""
        expanded = self._expand(node, refs) if depth <= _MAX_DEPTH else None
        if expanded is None:
            return None
        node, refs = expanded
        if any(key in node for key in UNIONS):
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
            candidates: list[_Expanded] = [({"enum": list(unique(values))}, refs)]
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
        base = {k: v for k, v in node.items() if k not in (*UNIONS, "description", "title")}
        out: list[_Expanded] = []
        for alt in node.get("anyOf") or node.get("oneOf") or []:
            expanded = self._expand(alt, refs)
            if expanded is None:
                continue
            merged = merge([expanded[0], base])
            if any(key in merged for key in UNIONS):
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
        also = " or ".join(ARTICLE.get(t, str(t)) for t in types[1:])
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
    kinds = {json_type(v) for v in values}
    if kinds == {"string"}:
        return "string", values
    shown = ", ".join(quote(v) for v in values)
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
            notes.append(f"Must be a multiple of {quote(node['multipleOf'])}.")
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in _GEMINI_FORMATS.get(kind, ()):
        out["format"] = fmt
    elif isinstance(fmt, str):
        notes.append(f"Format: {fmt}.")
    if node.get("uniqueItems") is True:
        notes.append("Items must be unique.")
    if "default" in node:
        notes.append(f"Default: {quote(node['default'])}.")


def _bounds(node: dict[str, Any], kind: str, out: dict[str, Any], notes: list[str]) -> None:
    """exclusiveMinimum/Maximum as minimum/maximum: exact for integers, else with a note."""
    low, high = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if is_number(low):
        edge: float = math.floor(low) + 1 if kind == "integer" else low
        out["minimum"] = max(out.get("minimum", edge), edge)
        if kind != "integer":
            notes.append(f"Must be greater than {quote(low)}.")
    if is_number(high):
        edge = math.ceil(high) - 1 if kind == "integer" else high
        out["maximum"] = min(out.get("maximum", edge), edge)
        if kind != "integer":
            notes.append(f"Must be less than {quote(high)}.")


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
