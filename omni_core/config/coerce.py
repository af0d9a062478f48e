"""Lossless coercion of a written value to the declared type of its field.

Command-line text is parsed by the field's type; a value from TOML already
has a type and must fit without loss. An int may land in a float field; a
float never lands in an int field, a bool never in a number. ``none`` means
null where the field admits null. Free-form keys (no declared type) use TOML
scalar rules: ``true``, ``7``, ``0.5``, everything else a string.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal, Union

import tomli

from ..schema.sizes import parse_bytes
from .toml_lines import too_deep

NoneType = type(None)
_INT = re.compile(r"^[+-]?\d[\d_]*$")
_NULL = ("none", "null")
MAX_FLAG_DEPTH = 64  # as a deploy file's MAX_DEPTH: far below Python's recursion limit


class BytesField:
    """Marker annotation: a byte size written as an integer or ``2GiB``."""


def toml_scalar(text: str) -> Any:
    """Parse command-line text with TOML's rules; anything unparsable is a string.

    Text nested too deeply to parse safely (tomli recurses) counts as unparsable.
    """
    if too_deep(text, MAX_FLAG_DEPTH) is not None:
        return text
    try:
        return tomli.loads(f"v = {text}")["v"]
    except tomli.TOMLDecodeError:
        return text


def describe(annotation: Any) -> str:
    """The type as a user reads it in an error message."""
    if annotation is None:
        return "any TOML value"
    if annotation is BytesField:
        return "a byte size (integer or e.g. 2GiB)"
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in typing.get_args(annotation))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin is list:
        return f"a list of {describe(typing.get_args(annotation)[0])}"
    if origin is dict:
        return "a table of " + describe(typing.get_args(annotation)[1])
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return "a table with " + ", ".join(annotation.model_fields)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if annotation is NoneType:
        return "none"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def coerce(value: Any, annotation: Any, *, from_text: bool) -> Any:
    """``value`` as ``annotation`` without loss; raise ValueError saying what was expected."""
    if annotation is None:
        return toml_scalar(value) if from_text else value
    try:
        return _coerce(value, annotation, from_text)
    except (ValueError, TypeError):
        raise ValueError(f"expected {describe(annotation)}, got {value!r}") from None


def _coerce(value: Any, annotation: Any, from_text: bool) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, typing.get_args(annotation), from_text)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value in choices and not isinstance(value, bool):
            return value
        raise ValueError
    if origin is list:
        return _coerce_list(value, typing.get_args(annotation)[0], from_text)
    if origin is dict:
        if isinstance(value, str) and from_text:
            value = toml_scalar(value)
        if not isinstance(value, dict):
            raise ValueError
        key_type, value_type = typing.get_args(annotation)
        return {
            _coerce(k, key_type, False): _coerce(v, value_type, False) for k, v in value.items()
        }
    if annotation is BytesField:
        if isinstance(value, str) and from_text and _INT.match(value):
            value = int(value)
        parse_bytes(value)
        return value
    if annotation is NoneType:
        if value is None or (isinstance(value, str) and value.lower() in _NULL):
            return None
        raise ValueError
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if from_text and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_text and _INT.match(value):
            return int(value)
        raise ValueError
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if from_text:
            parsed = toml_scalar(value)
            if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
                return float(parsed)
        raise ValueError
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ValueError
    if annotation is Any:
        return toml_scalar(value) if from_text else value
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        # A table of a settings model ([[cluster.nodes]]): its fields are
        # checked, with their own parsers, when the model is validated.
        if isinstance(value, str) and from_text:
            value = toml_scalar(value)
        if not isinstance(value, dict):
            raise ValueError
        return value
    raise TypeError(f"unsupported annotation {annotation!r}")


def _coerce_union(value: Any, options: tuple[Any, ...], from_text: bool) -> Any:
    nullable = NoneType in options
    if value is None and nullable:
        return None
    text_like = isinstance(value, str) and value.lower() in _NULL
    if text_like and nullable and (from_text or str not in options):
        return None
    for option in options:
        if option is NoneType:
            continue
        try:
            return _coerce(value, option, from_text)
        except (ValueError, TypeError):
            continue
    raise ValueError


def _coerce_list(value: Any, item: Any, from_text: bool) -> Any:
    if isinstance(value, str):
        text = value.strip()
        parsed = toml_scalar(text) if text.startswith("[") else None
        if isinstance(parsed, list):
            return [_coerce(v, item, False) for v in parsed]
        parts = [p.strip() for p in text.split(",") if p.strip()]
        return [_coerce(p, item, True) for p in parts]
    if isinstance(value, list):
        return [_coerce(v, item, from_text) for v in value]
    raise ValueError
