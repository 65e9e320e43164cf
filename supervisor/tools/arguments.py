"""Validation of call arguments against a tool's JSON Schema (draft 2020-12): the most
relevant violation as an ArgumentError that names the argument and never quotes more than
a short piece of a value."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias

from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

from stockade.supervisor.tools.phrasing import ARTICLE, json_type, quote, unique
from stockade.supervisor.tools.schema_tree import UNIONS, plain_copy


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
    plain = plain_copy(schema)
    Draft202012Validator.check_schema(plain)
    validator = _Draft202012(plain)
    if len(_validators) >= _CACHE_SIZE:
        _validators.pop(next(iter(_validators)), None)
    _validators[id(schema)] = (schema, validator)  # holding `schema` keeps its id unique
    return validator


_RANK: Final = {"required": 4, "dependentRequired": 4, "additionalProperties": 3, "type": 2}


def _relevance(error: ValidationError) -> tuple[int, int]:
    weak = error.validator in UNIONS
    return -len(error.path), -1 if weak else _RANK.get(str(error.validator), 1)


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
        return ArgumentError(field, f"missing required argument {quote(field)}")
    if keyword == "additionalProperties":
        field = ".".join([*path, _extra(schema, value)])
        return ArgumentError(field, f"unexpected argument {quote(field)}")
    field = ".".join(path)
    subject = f"argument {quote(field)}" if path else "arguments"
    if error.validator is None:  # a false schema; jsonschema gives it no path
        return ArgumentError(field, f"{subject}: a value is not allowed")
    return ArgumentError(field, f"{subject} {_complaint(keyword, expected, value, error)}")


def _complaint(keyword: str, expected: Any, value: Any, error: ValidationError) -> str:
    got = json_type(value)
    if keyword == "type":
        return f"must be {_types(expected)}, got {got}"
    if keyword in UNIONS:
        types = [e.validator_value for e in error.context or () if e.validator == "type"]
        if types and len(types) == len(error.context or ()):
            return f"must be {_types([t for ts in types for t in _listed(ts)])}, got {got}"
        return (
            "matched more than one accepted form"
            if error.context == []
            else "matched no accepted form"
        )
    if keyword == "enum":
        shown = ", ".join(quote(v) for v in expected[:10]) + (", ..." if len(expected) > 10 else "")
        return f"must be one of {shown}, got {quote(value)}"
    if keyword == "const":
        return f"must be {quote(expected)}, got {quote(value)}"
    if keyword in _COMPARISON:
        return f"must be {_COMPARISON[keyword]} {quote(expected)}, got {quote(value)}"
    if keyword in _COUNTS:
        size = len(value) if isinstance(value, str | list | dict) else "?"
        return f"{_COUNTS[keyword].format(expected)}, got {size}"
    if keyword == "pattern":
        return f"must match the pattern {quote(expected)}"
    if keyword == "multipleOf":
        return f"must be a multiple of {quote(expected)}, got {quote(value)}"
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
    return " or ".join(ARTICLE.get(t, str(t)) for t in unique(_listed(types)))


def json_type_phrase(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words with an article ("an array", "null")."""
    kind = json_type(value)
    return ARTICLE.get(kind, f"a {kind}")
