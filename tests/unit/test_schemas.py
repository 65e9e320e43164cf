"""Provider schema adaptation and argument validation (stockade.supervisor.tools.schemas).

The checkers encode what each provider documents (or answers with 400) for a tool entry.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from stockade.supervisor.tools import arguments, schemas
from stockade.supervisor.tools.catalog import TOOLS
from stockade.supervisor.tools.schemas import (
    ArgumentError,
    SchemaFormat,
    adapt_schema,
    declaration,
    validate_arguments,
)

# --- provider checkers ----------------------------------------------------------------------

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ANTHROPIC_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
GEMINI_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.-]{0,63}$")
GEMINI_KEYS = {
    "type",
    "format",
    "description",
    "nullable",
    "enum",
    "properties",
    "required",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "title",
    "propertyOrdering",
}
GEMINI_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT"}


def check_json(decl: dict[str, Any]) -> None:
    assert set(decl) == {"name", "description", "parameters"}
    Draft202012Validator.check_schema(decl["parameters"])


def check_openai(decl: dict[str, Any]) -> None:
    assert set(decl) == {"type", "function"}
    assert decl["type"] == "function"
    function = decl["function"]
    assert set(function) == {"name", "description", "parameters"}
    assert OPENAI_NAME.match(function["name"])
    params = function["parameters"]
    assert params["type"] == "object"
    assert isinstance(params["properties"], dict)
    assert not {"anyOf", "oneOf", "allOf", "enum", "not"} & set(params)
    Draft202012Validator.check_schema(params)


def check_anthropic(decl: dict[str, Any]) -> None:
    assert set(decl) == {"name", "description", "input_schema"}
    assert ANTHROPIC_NAME.match(decl["name"])
    assert decl["input_schema"]["type"] == "object"
    Draft202012Validator.check_schema(decl["input_schema"])


def gemini_problems(schema: Any, where: str = "parameters") -> list[str]:
    """Everything in `schema` that Gemini's function-declaration Schema refuses: keys outside
    the subset, unions, non-string enums, bad types; and two known 400s: an OBJECT without
    properties ("should be non-empty for OBJECT type") and an ARRAY without items."""
    if not isinstance(schema, dict):
        return [f"{where}: not an object"]
    problems = [f"{where}: key {key!r}" for key in schema if key not in GEMINI_KEYS]
    kind = schema.get("type")
    if kind is not None and (not isinstance(kind, str) or kind.upper() not in GEMINI_TYPES):
        problems.append(f"{where}: type {kind!r}")
    kind = kind.upper() if isinstance(kind, str) else None
    if "enum" in schema and not all(isinstance(v, str) for v in schema["enum"]):
        problems.append(f"{where}: non-string enum")
    if "properties" in schema and kind != "OBJECT":
        problems.append(f"{where}: properties on {kind}")
    if "items" in schema and kind != "ARRAY":
        problems.append(f"{where}: items on {kind}")
    if kind == "OBJECT" and not schema.get("properties"):
        problems.append(f"{where}: OBJECT without properties")
    if kind == "ARRAY" and "items" not in schema:
        problems.append(f"{where}: ARRAY without items")
    for name, sub in schema.get("properties", {}).items():
        problems += gemini_problems(sub, f"{where}.{name}")
    if "items" in schema:
        problems += gemini_problems(schema["items"], f"{where}[]")
    missing = set(schema.get("required", [])) - set(schema.get("properties", {}))
    problems += [f"{where}: required {name!r} not a property" for name in sorted(missing)]
    return problems


def check_gemini(decl: dict[str, Any]) -> None:
    assert set(decl) <= {"name", "description", "parameters"}
    assert GEMINI_NAME.match(decl["name"])
    if "parameters" in decl:
        assert decl["parameters"]["type"].upper() == "OBJECT"
        assert gemini_problems(decl["parameters"]) == []


CHECKERS: dict[SchemaFormat, Callable[[dict[str, Any]], None]] = {
    SchemaFormat.JSON_SCHEMA: check_json,
    SchemaFormat.OPENAI: check_openai,
    SchemaFormat.ANTHROPIC: check_anthropic,
    SchemaFormat.GEMINI: check_gemini,
}


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "OBJECT", "properties": {"a": {"anyOf": [{"type": "STRING"}]}}}, "key 'anyOf'"),
        ({"type": "OBJECT", "properties": {"a": {"type": "INTEGER", "enum": [1]}}}, "non-string"),
        ({"type": "OBJECT", "properties": {"a": {"type": ["STRING", "NULL"]}}}, "type"),
        ({"type": "OBJECT", "properties": {"a": {"type": "OBJECT"}}}, "without properties"),
        ({"type": "OBJECT", "properties": {"a": {"type": "ARRAY"}}}, "without items"),
        ({"type": "OBJECT", "properties": {"a": {"type": "STRING"}}, "required": ["b"]}, "'b'"),
        ({"type": "OBJECT", "properties": {"a": {"type": "STRING", "const": "x"}}}, "'const'"),
        (
            {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
            "'additionalProperties'",
        ),
    ],
)
def test_gemini_checker_catches(schema: dict[str, Any], problem: str) -> None:
    assert any(problem in p for p in gemini_problems(schema))


# --- the catalog in every format ------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(SchemaFormat))
@pytest.mark.parametrize("name", sorted(TOOLS))
def test_catalog_declarations_are_accepted(name: str, fmt: SchemaFormat) -> None:
    tool = TOOLS[name]
    before = copy.deepcopy(tool.parameters)
    decl = declaration(tool.name, tool.description, tool.parameters, fmt)
    CHECKERS[fmt](decl)
    assert json.loads(json.dumps(decl)) == decl
    assert tool.parameters == before


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_json_format_is_the_catalog_schema(name: str) -> None:
    assert adapt_schema(TOOLS[name].parameters, SchemaFormat.JSON_SCHEMA) == TOOLS[name].parameters


def test_gemini_exec_keeps_what_it_can_and_says_what_it_drops() -> None:
    params = adapt_schema(TOOLS["exec"].parameters, SchemaFormat.GEMINI)
    assert params["required"] == ["command"]
    assert set(params["properties"]) == {"command", "timeout", "workdir", "stdin", "session"}
    assert "'env'" in params["description"]
    timeout = params["properties"]["timeout"]
    assert (timeout["type"], timeout["minimum"]) == ("NUMBER", 0)
    assert "greater than 0" in timeout["description"]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("bad name", SchemaFormat.OPENAI),
        ("x" * 65, SchemaFormat.ANTHROPIC),
        ("tools.read", SchemaFormat.OPENAI),
        ("9lives", SchemaFormat.GEMINI),
    ],
)
def test_declaration_refuses_names_the_provider_refuses(name: str, fmt: SchemaFormat) -> None:
    with pytest.raises(ValueError, match="not accepted"):
        declaration(name, "d", {"type": "object"}, fmt)


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="'mistral' is not a valid SchemaFormat"):
        adapt_schema({"type": "object"}, "mistral")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid SchemaFormat"):
        declaration("t", "d", {"type": "object"}, "mistral")  # type: ignore[arg-type]


def test_gemini_accepts_dotted_names_and_omits_empty_parameters() -> None:
    decl = declaration(
        "tools.ping", "Ping.", {"type": "object", "properties": {}}, SchemaFormat.GEMINI
    )
    assert decl == {"name": "tools.ping", "description": "Ping."}


# --- OpenAI and Anthropic normalization -----------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({}, {"type": "object", "properties": {}}),
        (
            {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$id": "x",
                "type": "object",
            },
            {"type": "object", "properties": {}},
        ),
        (
            {"properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        ),
        (
            {
                "anyOf": [
                    {
                        "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                        "required": ["a", "b"],
                    },
                    {
                        "properties": {"a": {"type": "string"}, "c": {"type": "boolean"}},
                        "required": ["a"],
                    },
                ]
            },
            {
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "b": {"type": "integer"},
                    "c": {"type": "boolean"},
                },
                "required": ["a"],
            },
        ),
        (
            {
                "$defs": {"base": {"properties": {"a": {"type": "string"}}, "required": ["a"]}},
                "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {"type": "integer"}}}],
            },
            {
                "$defs": {"base": {"properties": {"a": {"type": "string"}}, "required": ["a"]}},
                "type": "object",
                "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                "required": ["a"],
            },
        ),
    ],
)
def test_openai_normalization(schema: dict[str, Any], expected: dict[str, Any]) -> None:
    out = adapt_schema(schema, SchemaFormat.OPENAI)
    assert out == expected
    check_openai(
        {"type": "function", "function": {"name": "t", "description": "", "parameters": out}}
    )


def test_anthropic_keeps_full_schema_without_dollar_schema() -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "additionalProperties": False,
    }
    out = adapt_schema(schema, SchemaFormat.ANTHROPIC)
    assert out == {
        "type": "object",
        "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "additionalProperties": False,
    }


# --- hostile schemas through the Gemini adaptation ------------------------------------------

POINT = {
    "type": "object",
    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
    "required": ["x", "y"],
}
NODE = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
    },
}


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def depth(schema: dict[str, Any]) -> int:
    subs = [
        *schema.get("properties", {}).values(),
        *([schema["items"]] if "items" in schema else []),
    ]
    return 1 + max((depth(s) for s in subs), default=0)


GEMINI_CASES: list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], bool]]] = [
    (
        "nested anyOf with null",
        obj(
            when={
                "description": "Deadline.",
                "anyOf": [
                    {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
                    {"type": "null"},
                ],
            }
        ),
        lambda p: (
            p["properties"]["when"]
            == {
                "type": "STRING",
                "format": "date-time",
                "nullable": True,
                "description": "Deadline.",
            }
        ),
    ),
    (
        "nullable object in anyOf",
        obj(
            opts={
                "anyOf": [
                    {"type": "null"},
                    obj(n={"anyOf": [{"type": "integer"}, {"type": "null"}]}),
                ]
            }
        ),
        lambda p: (
            p["properties"]["opts"]["nullable"] is True
            and p["properties"]["opts"]["properties"]["n"] == {"type": "INTEGER", "nullable": True}
        ),
    ),
    (
        "oneOf of string enums",
        obj(
            mode={
                "oneOf": [
                    {"enum": ["a", "b"]},
                    {"const": "c"},
                    {"type": "string", "enum": ["b", "d"]},
                ]
            }
        ),
        lambda p: p["properties"]["mode"] == {"type": "STRING", "enum": ["a", "b", "c", "d"]},
    ),
    (
        "allOf",
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {
                    "properties": {"b": {"type": "integer", "exclusiveMinimum": 0}},
                    "required": ["b"],
                },
            ]
        },
        lambda p: (
            p["required"] == ["a", "b"]
            and p["properties"]["b"] == {"type": "INTEGER", "minimum": 1}
        ),
    ),
    (
        "$ref to $defs",
        {
            "$defs": {"point": POINT},
            **obj(
                start={"$ref": "#/$defs/point"},
                end={"$ref": "#/$defs/point", "description": "End."},
            ),
        },
        lambda p: (
            p["properties"]["start"]["required"] == ["x", "y"]
            and p["properties"]["end"]["description"] == "End."
            and p["properties"]["end"]["properties"]["x"] == {"type": "NUMBER"}
        ),
    ),
    (
        "recursive $ref",
        {"$defs": {"node": NODE}, **obj(tree={"$ref": "#/$defs/node"})},
        lambda p: (
            "name" in p["properties"]["tree"]["properties"]["children"]["items"]["properties"]
            and depth(p) < 10
        ),
    ),
    (
        "recursive root $ref",
        obj(value={"type": "string"}, next={"$ref": "#"}),
        lambda p: (
            p["properties"]["next"]["properties"]["value"] == {"type": "STRING"} and depth(p) < 10
        ),
    ),
    (
        "const",
        obj(kind={"const": "file"}, version={"const": 2}),
        lambda p: (
            p["properties"]["kind"] == {"type": "STRING", "enum": ["file"]}
            and p["properties"]["version"] == {"type": "INTEGER", "description": "One of: 2."}
        ),
    ),
    (
        "list types",
        obj(n={"type": ["integer", "null"]}, x={"type": ["string", "integer"]}),
        lambda p: (
            p["properties"]["n"] == {"type": "INTEGER", "nullable": True}
            and p["properties"]["x"]["type"] == "STRING"
            and "an integer" in p["properties"]["x"]["description"]
        ),
    ),
    (
        "integer enum",
        obj(level={"type": "integer", "enum": [1, 2, 3], "description": "Level."}),
        lambda p: (
            p["properties"]["level"]
            == {"type": "INTEGER", "description": "Level. One of: 1, 2, 3."}
        ),
    ),
    (
        "union of enums of several kinds",
        obj(v={"anyOf": [{"enum": ["a", 1]}, {"enum": [True, None]}]}),
        lambda p: (
            p["properties"]["v"]["enum"] == ["a", "1", "true"]
            and p["properties"]["v"]["nullable"] is True
        ),
    ),
    (
        "additionalProperties map",
        obj(
            name={"type": "string"},
            labels={"type": "object", "additionalProperties": {"type": "string"}},
        ),
        lambda p: set(p["properties"]) == {"name"} and "'labels'" in p["description"],
    ),
    (
        "object with properties and additionalProperties",
        {**obj(a={"type": "boolean"}), "additionalProperties": {"type": "string"}},
        lambda p: p == {"type": "OBJECT", "properties": {"a": {"type": "BOOLEAN"}}},
    ),
    (
        "anyOf of unlike forms takes the object",
        obj(target={"anyOf": [{"type": "string"}, obj(path={"type": "string"})]}),
        lambda p: (
            p["properties"]["target"]["type"] == "OBJECT"
            and "one of 2" in p["properties"]["target"]["description"]
        ),
    ),
    (
        "unsupported keywords",
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "urn:x",
            **obj(
                n={"type": "number", "exclusiveMaximum": 5, "default": 1, "examples": [2]},
                s={"type": "string", "format": "uuid", "minLength": 1},
                i={"type": "integer", "format": "int64", "multipleOf": 2},
                m={"type": "object", "patternProperties": {"^x": {"type": "string"}}},
            ),
        },
        lambda p: (
            p["properties"]["n"]["maximum"] == 5
            and "less than 5" in p["properties"]["n"]["description"]
            and "Default: 1" in p["properties"]["n"]["description"]
            and p["properties"]["s"]
            == {"type": "STRING", "minLength": 1, "description": "Format: uuid."}
            and p["properties"]["i"]["format"] == "int64"
            and "m" not in p["properties"]
        ),
    ),
    (
        "array without items and any value",
        obj(tags={"type": "array"}, anything={}),
        lambda p: (
            p["properties"]["tags"]["items"]["type"] == "STRING"
            and p["properties"]["anything"]["type"] == "STRING"
        ),
    ),
    (
        "false schema and null-only property",
        obj(a={"type": "string"}, never=False, nothing={"type": "null"}),
        lambda p: set(p["properties"]) == {"a"},
    ),
]


@pytest.mark.parametrize(
    ("schema", "keeps"), [c[1:] for c in GEMINI_CASES], ids=[c[0] for c in GEMINI_CASES]
)
def test_gemini_adaptation_of_hostile_schemas(
    schema: dict[str, Any], keeps: Callable[[dict[str, Any]], bool]
) -> None:
    before = copy.deepcopy(schema)
    out = adapt_schema(schema, SchemaFormat.GEMINI)
    assert gemini_problems(out) == []
    assert keeps(out), json.dumps(out)
    assert schema == before
    check_gemini(declaration("t", "d", schema, SchemaFormat.GEMINI))


def test_gemini_parameters_nothing_expressible() -> None:
    schema = {"type": "object", "additionalProperties": {"type": "string"}, "description": "Map."}
    assert adapt_schema(schema, SchemaFormat.GEMINI) == {"type": "OBJECT", "description": "Map."}
    assert declaration("t", "d", schema, SchemaFormat.GEMINI) == {"name": "t", "description": "d"}


# --- argument validation --------------------------------------------------------------------

BIG = "x" * 10_000_000


@pytest.mark.parametrize(
    ("tool", "arguments", "field", "message"),
    [
        ("exec", {}, "command", "missing required argument 'command'"),
        ("exec", {"timeout": "x", "bogus": 1}, "command", "missing required argument 'command'"),
        ("exec", {"command": "ls", "bogus": 1}, "bogus", "unexpected argument 'bogus'"),
        (
            "exec",
            {"command": "ls", "timeout": "10"},
            "timeout",
            "argument 'timeout' must be a number, got string",
        ),
        ("exec", {"command": "ls", "timeout": True}, "timeout", "must be a number, got boolean"),
        (
            "exec",
            {"command": "ls", "timeout": 0},
            "timeout",
            "argument 'timeout' must be > 0, got 0",
        ),
        ("exec", {"command": 1}, "command", "argument 'command' must be a string, got integer"),
        (
            "exec",
            {"command": "ls", "env": ["A=B"]},
            "env",
            "argument 'env' must be an object, got array",
        ),
        (
            "exec",
            {"command": "ls", "env": {"A=B": 1}},
            "env.A=B",
            "argument 'env.A=B' must be a string, got integer",
        ),
        ("exec", {"command": "ls", "env": {"A": None}}, "env.A", "must be a string, got null"),
        (
            "read_file",
            {"path": "a", "start_line": True},
            "start_line",
            "must be an integer, got boolean",
        ),
        (
            "read_file",
            {"path": "a", "start_line": 1.5},
            "start_line",
            "must be an integer, got number",
        ),
        ("read_file", {"path": "a", "start_line": 0}, "start_line", "must be >= 1, got 0"),
        (
            "write_file",
            {"path": 2.5, "content": "x"},
            "path",
            "argument 'path' must be a string, got number",
        ),
        ("edit_file", {"path": "a", "old_text": "a", "new_text": {}}, "new_text", "got object"),
        (
            "search",
            {"pattern": "x", "max_results": 5000},
            "max_results",
            "must be <= 1000, got 5000",
        ),
        (
            "search",
            {"pattern": "x", "max_results": "5"},
            "max_results",
            "must be an integer, got string",
        ),
    ],
)
def test_validate_arguments_rejects(
    tool: str, arguments: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ArgumentError) as info:
        validate_arguments(TOOLS[tool].parameters, arguments)
    assert info.value.field == field
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("exec", {"command": "ls"}),
        ("exec", {"command": "ls", "timeout": 0.5, "workdir": "src", "env": {"A": "1", "B=C": ""}}),
        ("read_file", {"path": "a", "start_line": 1, "end_line": 3}),
        ("read_file", {"path": "a", "start_line": 2.0}),
        ("list_files", {}),
        ("search", {"pattern": "x", "max_results": 1000, "glob": "*.py", "path": "."}),
    ],
)
def test_validate_arguments_accepts(tool: str, arguments: dict[str, Any]) -> None:
    validate_arguments(TOOLS[tool].parameters, arguments)  # raises if refused


@pytest.mark.parametrize("arguments", [[], "x", None, 3])
def test_validate_arguments_root_must_be_object(arguments: Any) -> None:
    with pytest.raises(ArgumentError, match=r"^arguments must be an object, got ") as info:
        validate_arguments(TOOLS["exec"].parameters, arguments)
    assert info.value.field == ""


CUSTOM = {
    "type": "object",
    "properties": {
        "mode": {"enum": ["fast", "slow"]},
        "code": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "id": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "n": {"type": "number", "exclusiveMinimum": 0, "maximum": 10},
        "m": {"type": "integer", "minimum": 1, "exclusiveMaximum": 11},
    },
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("arguments", "field", "message"),
    [
        ({"mode": "medium"}, "mode", "argument 'mode' must be one of 'fast', 'slow', got 'medium'"),
        (
            {"code": "abcdefghij"},
            "code",
            "argument 'code' must be at most 8 characters long, got 10",
        ),
        ({"code": "ABC"}, "code", "argument 'code' must match the pattern '^[a-z]+$'"),
        ({"tags": ["a", "b", "c"]}, "tags", "argument 'tags' must have at most 2 items, got 3"),
        ({"tags": ["a", 1]}, "tags.1", "argument 'tags.1' must be a string, got integer"),
        ({"id": [1]}, "id", "argument 'id' must be a string or an integer, got array"),
        ({"n": 0}, "n", "argument 'n' must be > 0, got 0"),
        ({"n": 10.5}, "n", "argument 'n' must be <= 10, got 10.5"),
        ({"m": 0}, "m", "argument 'm' must be >= 1, got 0"),
        ({"m": 11}, "m", "argument 'm' must be < 11, got 11"),
    ],
)
def test_validate_arguments_messages(arguments: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ArgumentError) as info:
        validate_arguments(CUSTOM, arguments)
    assert (info.value.field, str(info.value)) == (field, message)


@pytest.mark.parametrize(
    ("schema", "arguments"),
    [
        (TOOLS["exec"].parameters, {"command": "ls", "timeout": BIG}),
        (TOOLS["exec"].parameters, {"command": ["ls"] * 1_000_000}),
        (TOOLS["exec"].parameters, {"command": "ls", BIG: 1}),
        (CUSTOM, {"mode": BIG}),
        (CUSTOM, {"code": BIG}),
        ({"type": "object", "properties": {"k": {"const": BIG[:500]}}}, {"k": BIG}),
        (TOOLS["search"].parameters, {"pattern": "x", "max_results": 10**4000}),
        (TOOLS["search"].parameters, {"pattern": "x", "max_results": -(10**5000)}),
    ],
)
def test_huge_values_give_short_messages(schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    with pytest.raises(ArgumentError) as info:
        validate_arguments(schema, arguments)
    assert len(str(info.value)) < 600


class NoRepr(str):
    """A string that fails the test if anything takes its repr()."""

    def __repr__(self) -> str:
        raise AssertionError("repr() of an argument value")


@pytest.mark.parametrize(
    ("schema", "arguments", "field"),
    [
        (TOOLS["exec"].parameters, {"command": "ls", "timeout": NoRepr("x" * 200)}, "timeout"),
        (CUSTOM, {"code": NoRepr("x" * 200)}, "code"),
        (CUSTOM, {"code": NoRepr("X" * 5)}, "code"),
        (
            {"type": "object", "properties": {"s": {"minLength": 300}}},
            {"s": NoRepr("x" * 200)},
            "s",
        ),
    ],
)
def test_wrong_strings_are_never_repr_d(
    schema: dict[str, Any], arguments: dict[str, Any], field: str
) -> None:
    with pytest.raises(ArgumentError) as info:
        validate_arguments(schema, arguments)
    assert info.value.field == field


@pytest.mark.parametrize(
    "instance",
    [
        {"code": "abc", "tags": ["a"], "id": 3},
        {"code": "", "mode": "fast"},
        {"code": "abcdefghi"},
        {"code": "ab1"},
        {"tags": ["a", True]},
        {"id": 1.5},
        {"id": None},
        {"mode": "fast", "extra": 1},
        [],
        "code",
        {"n": 0},
        {"n": 0.5},
        {"n": 10},
        {"n": 10.5},
        {"n": 11},
        {"n": True},
        {"n": "5"},
        {"m": 0},
        {"m": 1},
        {"m": 10},
        {"m": 11},
        {"m": 10.0},
    ],
)
def test_short_message_keywords_agree_with_jsonschema(instance: Any) -> None:
    expected = Draft202012Validator(CUSTOM).is_valid(instance)
    assert arguments._validator(CUSTOM).is_valid(instance) is expected


def test_validators_are_compiled_once_per_schema() -> None:
    schema = TOOLS["exec"].parameters
    assert arguments._validator(schema) is arguments._validator(schema)
    equal_but_other = copy.deepcopy(dict(schema))
    assert arguments._validator(equal_but_other) is not arguments._validator(schema)


def test_public_api() -> None:
    assert set(schemas.__all__) == {
        "ArgumentError",
        "SchemaFormat",
        "adapt_schema",
        "declaration",
        "validate_arguments",
    }
    assert issubclass(ArgumentError, ValueError)
    assert [f.value for f in SchemaFormat] == ["json", "openai", "anthropic", "gemini"]


# --- what the providers answer with 400, checked everywhere in the schema -------------------

_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = (
    "items", "additionalProperties", "contains", "not", "if", "then", "else",
    "propertyNames", "unevaluatedItems", "unevaluatedProperties",
)  # fmt: skip


def subschemas(schema: Any, where: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema object in `schema` with its path, `schema` first."""
    if not isinstance(schema, dict):
        return []
    found = [(where or "root", schema)]
    for key in _SUBSCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            found += subschemas(sub, f"{where}.{key}.{name}")
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or []):
            found += subschemas(sub, f"{where}.{key}[{i}]")
    for key in _SUBSCHEMA_ONE:
        found += subschemas(schema.get(key), f"{where}.{key}")
    return found


def openai_problems(params: dict[str, Any]) -> list[str]:
    """OpenAI's 400s for function parameters: top-level type object without combinators
    ("schema must be a JSON Schema of 'type: \"object\"'"), and anywhere an array without
    items ("In context=('properties', 'tags'), array schema missing items")."""
    problems = [] if params.get("type") == "object" else ["root: type is not object"]
    problems += [f"root: {k}" for k in ("anyOf", "oneOf", "allOf", "enum", "not") if k in params]
    for where, sub in subschemas(params):
        types = sub.get("type")
        is_array = types == "array" or (isinstance(types, list) and "array" in types)
        if is_array and "items" not in sub:
            problems.append(f"{where}: array schema missing items")
    return problems


def anthropic_problems(schema: dict[str, Any]) -> list[str]:
    """Anthropic's 400 "input_schema does not support oneOf, allOf, or anyOf at the top
    level", and its rule that input_schema is of type object."""
    problems = [] if schema.get("type") == "object" else ["root: type is not object"]
    return problems + [f"root: {k}" for k in ("anyOf", "oneOf", "allOf") if k in schema]


HOSTILE_CUSTOM: list[tuple[str, dict[str, Any]]] = [
    (
        "top-level anyOf of required",
        {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
            "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
    ),
    (
        "top-level oneOf of objects",
        {
            "oneOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        },
    ),
    (
        "top-level allOf with $ref",
        {
            "$defs": {"base": {"type": "object", "properties": {"a": {"type": "string"}}}},
            "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {"type": "boolean"}}}],
        },
    ),
    (
        "arrays without items",
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array"},
                "either": {"type": ["string", "array"]},
                "nested": {
                    "type": "object",
                    "properties": {"m": {"type": "array", "maxItems": 3}},
                },
                "list_of_lists": {"type": "array", "items": {"type": "array"}},
                "maybe": {"anyOf": [{"type": "array"}, {"type": "null"}]},
                "ref": {"$ref": "#/$defs/bare"},
                "tuple": {"type": "array", "prefixItems": [{"type": "string"}]},
            },
            "$defs": {"bare": {"type": "array"}},
        },
    ),
    (
        "hostile mix",
        {
            "type": "object",
            "properties": {
                "c": {"const": "x"},
                "n": {"type": ["string", "null"]},
                "p": {"type": "object", "patternProperties": {"^x": {"type": "array"}}},
                "d": {"oneOf": [{"type": "string"}, {"type": "array"}]},
            },
            "additionalProperties": {"type": "array"},
        },
    ),
]


@pytest.mark.parametrize(
    "schema", [c[1] for c in HOSTILE_CUSTOM], ids=[c[0] for c in HOSTILE_CUSTOM]
)
def test_hostile_custom_schemas_pass_every_providers_rules(schema: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(schema)
    before = copy.deepcopy(schema)
    openai = declaration("t", "d", schema, SchemaFormat.OPENAI)["function"]["parameters"]
    assert openai_problems(openai) == [], json.dumps(openai)
    Draft202012Validator.check_schema(openai)
    anthropic = declaration("t", "d", schema, SchemaFormat.ANTHROPIC)["input_schema"]
    assert anthropic_problems(anthropic) == [], json.dumps(anthropic)
    Draft202012Validator.check_schema(anthropic)
    gemini = declaration("t", "d", schema, SchemaFormat.GEMINI)
    check_gemini(gemini)
    assert schema == before


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_catalog_passes_the_strict_checkers(name: str) -> None:
    params = TOOLS[name].parameters
    assert len(TOOLS[name].description) <= 1024  # OpenAI: 400 string_above_max_length
    assert openai_problems(adapt_schema(params, SchemaFormat.OPENAI)) == []
    assert anthropic_problems(adapt_schema(params, SchemaFormat.ANTHROPIC)) == []


def test_anthropic_top_level_union_keeps_what_validation_needs() -> None:
    """Merged like OpenAI's: every property offered, only what all alternatives require
    is required; the original still validates the call."""
    schema = HOSTILE_CUSTOM[1][1]
    out = adapt_schema(schema, SchemaFormat.ANTHROPIC)
    assert set(out["properties"]) == {"a", "b"}
    assert "required" not in out


def test_array_items_added_mean_any_item() -> None:
    out = adapt_schema(HOSTILE_CUSTOM[3][1], SchemaFormat.OPENAI)
    assert out["properties"]["tags"] == {"type": "array", "items": {}}
    assert out["properties"]["list_of_lists"]["items"] == {"type": "array", "items": {}}
    for instance in ({"tags": [1, "a", None]}, {"either": "x"}, {"list_of_lists": [[1], []]}):
        assert Draft202012Validator(out).is_valid(instance)
