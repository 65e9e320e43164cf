"""Walking a JSON Schema: its subschemas, same-document `$ref` pointers, and merging
object schemas into one. Used by the provider adaptations and the catalog's checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

UNIONS: Final = ("anyOf", "oneOf")


def plain_copy(value: Any) -> Any:
    """A deep copy made of dicts and lists only, as json.dumps wants it."""
    if isinstance(value, Mapping):
        return {key: plain_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain_copy(item) for item in value]
    return value


def merge(schemas: Iterable[Mapping[str, Any]], *, union: bool = False) -> dict[str, Any]:
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


def children(node: Mapping[str, Any]) -> list[Any]:
    """The subschemas of a schema object (not property names that look like keywords)."""
    subs = [node[key] for key in _SUBSCHEMA_ONE if key in node]
    subs += [s for key in _SUBSCHEMA_LISTS if isinstance(node.get(key), list) for s in node[key]]
    subs += [
        s for key in _SUBSCHEMA_MAPS if isinstance(node.get(key), dict) for s in node[key].values()
    ]
    return subs


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
            if key in node and pointer(schema, node[key]) is None:
                problems.append(f"{key} {node[key]!r} points nowhere in the schema")
        stack.extend((sub, False) for sub in children(node))
    return problems


def resolve_local(root: Mapping[str, Any], node: Any) -> dict[str, Any]:
    """`node` itself, or the local definition its `$ref` points to (siblings win)."""
    if not isinstance(node, dict):
        return {}
    target = pointer(root, node.get("$ref"))
    rest = {k: v for k, v in node.items() if k != "$ref"}
    return {**target, **rest} if isinstance(target, dict) else rest


def pointer(root: Any, ref: Any) -> Any:
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
