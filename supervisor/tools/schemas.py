"""Tool schemas as each LLM provider wants them, and validation of call arguments.

The catalog holds plain JSON Schema (draft 2020-12). `adapt_schema` rewrites one for a
provider and `declaration` wraps it in that provider's tool entry. Call arguments are always
validated against the catalog's schema, never an adapted one. So where a provider cannot
express a schema, the adaptation narrows rather than widens it (what a model sends under
the adapted schema still passes validation) and says in the description what it left out.

This module holds the formats; gemini.py the Gemini rewrite, schema_tree.py the walking of
a schema, arguments.py the validation (re-exported here, where callers look for it).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any, Final

from stockade.supervisor.tools.arguments import ArgumentError, validate_arguments
from stockade.supervisor.tools.arguments import json_type_phrase as json_type_phrase
from stockade.supervisor.tools.gemini import gemini_parameters
from stockade.supervisor.tools.schema_tree import children, merge, plain_copy, resolve_local

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
    gemini: the OpenAPI 3.0 subset Gemini accepts; see tools/gemini.py.
    """
    plain: dict[str, Any] = plain_copy(schema)
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
            return gemini_parameters(plain)


def _object_root(schema: dict[str, Any]) -> dict[str, Any]:
    """The root as one object schema: combinators merged, nothing but an object allowed."""
    for key in ("$schema", "$id", "enum", "const", "not"):
        schema.pop(key, None)
    parts = [resolve_local(schema, part) for part in schema.pop("allOf", [])]
    schema = merge([schema, *parts])
    alternatives = [*schema.pop("anyOf", []), *schema.pop("oneOf", [])]
    if alternatives:
        variants = [resolve_local(schema, alt) for alt in alternatives]
        schema = merge([schema, merge(variants, union=True)])
    schema.setdefault("properties", {})
    return {**schema, "type": "object"}


def _with_items(node: Any) -> None:
    """Give every array schema in `node` (changed in place) that has no `items` `items: {}`."""
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if (kind == "array" or (isinstance(kind, list) and "array" in kind)) and "items" not in node:
        node["items"] = {}
    for sub in children(node):
        _with_items(sub)
