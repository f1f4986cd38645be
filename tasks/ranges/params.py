"""Run parameters of a range job: a standard-library dataclass declared on the job.

    @dataclass(frozen=True)
    class BackfillParams:
        tenant: int                      # no default: required at start
        since: date | None = None        # Optional: "" on the CLI or null in JSON is None

    register(RangeJob(..., params=BackfillParams, where=lambda p: t.c.tenant == p.tenant))

Values arrive as text from the CLI (`--param tenant=42`) or as JSON from `celery call` kwargs
(`{"job": ..., "params": {"tenant": 42}}`), and are coerced to the declared field types
(int, float, str, bool, datetime.date, datetime.datetime, and Optional of those) by `build`,
which refuses an unknown name, a missing required field or a value of the wrong type with
`InvalidParams`: one line naming the job and the field. The dataclass's own `__post_init__`
may refuse a value too (its ValueError or TypeError becomes `InvalidParams`).

The run stores the coerced values as JSON text (`encode`: dates and datetimes in ISO 8601), and
every worker rebuilds the instance from it with the same coercion (`decode`), so what
`process` gets in `ctx.params` is what the start validated. JSON only: nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any, NamedTuple

from tasks.store.validate import InvalidArguments, quote

__all__ = ["InvalidParams", "ParamField", "fields_of", "parse_pairs", "build", "encode",
           "decode", "values_of", "as_text", "MAX_TEXT", "MAX_JSON"]

MAX_TEXT = 1000  # characters of one str value
MAX_JSON = 16_384  # characters of a run's encoded parameters

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class InvalidParams(InvalidArguments):
    """A run's parameters were refused (unknown, missing, of the wrong type); nothing changed."""


class ParamField(NamedTuple):
    """One declared parameter: its name, its type, whether None is allowed, whether required."""

    name: str
    kind: type
    optional: bool
    required: bool


def _kind_of(hint: Any) -> tuple[type, bool] | None:
    """(type, optional) of a supported annotation; None for anything else."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        found = _kind_of(rest[0]) if len(rest) == 1 else None
        return (found[0], True) if found is not None else None
    if hint in (int, float, str, bool, date, datetime):
        return hint, False
    return None


def fields_of(cls: object) -> list[ParamField]:
    """The parameters a dataclass declares; `ValueError` (at registration) for anything else."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"params must be a dataclass class, got {cls!r}")
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind = _kind_of(hints.get(f.name))
        if kind is None:
            raise ValueError(f"params {cls.__name__}.{f.name}: {hints.get(f.name)} is not "
                             "supported (int, float, str, bool, date, datetime or Optional "
                             "of one)")
        required = (f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING)
        found.append(ParamField(f.name, kind[0], kind[1], required))
    return found


def parse_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """`["tenant=42", "since=2026-01-01"]` (the CLI's --param) as a dict of text values."""
    given: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise InvalidParams(f"--param {quote(pair)}: expected NAME=VALUE")
        if name.strip() in given:
            raise InvalidParams(f"--param {quote(name.strip())} is given twice")
        given[name.strip()] = value
    return given


def _text_to(kind: type, value: str) -> Any:
    if kind is bool:
        if value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ValueError
    if kind is datetime:
        return datetime.fromisoformat(value)
    if kind is date:
        return date.fromisoformat(value)
    return kind(value)


def _coerce(field: ParamField, value: object) -> Any:
    """`value` (text from the CLI or a JSON value) as the field's type; ValueError if not."""
    kind = field.kind
    if isinstance(value, str) and kind is not str:
        parsed = _text_to(kind, value.strip())
    elif kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        parsed = float(value)
    elif type(value) is kind:  # a date is no datetime, a bool no int
        parsed = value
    else:
        raise ValueError
    if kind is float and not math.isfinite(parsed):
        raise ValueError
    if kind is str and len(parsed) > MAX_TEXT:
        raise OverflowError
    return parsed


def _value(job: str, field: ParamField, value: object) -> Any:
    if value is None or (field.optional and value == ""):
        if field.optional:
            return None
        raise InvalidParams(f"{job}: parameter {field.name} may not be empty "
                            f"(a {field.kind.__name__})")
    try:
        return _coerce(field, value)
    except OverflowError:
        raise InvalidParams(f"{job}: parameter {field.name}: longer than {MAX_TEXT} "
                            "characters") from None
    except (ValueError, TypeError):
        what = {int: "an int", float: "a finite float"}.get(field.kind,
                                                              f"a {field.kind.__name__}")
        shown = quote(value) if isinstance(value, str) else repr(value)[:40]
        raise InvalidParams(f"{job}: parameter {field.name}: {shown} is not {what}") from None


def build(job: str, cls: type, given: object) -> Any:
    """An instance of `cls` from `given` (a mapping of names to text or JSON values);
    `InvalidParams` naming the job and the field for anything it cannot accept."""
    if not isinstance(given, Mapping):
        raise InvalidParams(f"{job}: parameters must be an object of NAME: VALUE, got "
                            f"{type(given).__name__}")
    declared = {f.name: f for f in fields_of(cls)}
    unknown = sorted(str(name) for name in given if name not in declared)
    if unknown:
        raise InvalidParams(f"{job}: unknown parameter {quote(unknown[0])} (known: "
                            f"{', '.join(declared) or 'none'})")
    missing = [name for name, f in declared.items() if f.required and name not in given]
    if missing:
        raise InvalidParams(f"{job}: missing required parameter {', '.join(missing)}")
    values = {name: _value(job, declared[name], value) for name, value in given.items()}
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:
        reason = " ".join(str(exc).split())[:300]
        raise InvalidParams(f"{job}: {reason}") from None


def _jsonable(value: object) -> Any:
    return value.isoformat() if isinstance(value, date) else value


def encode(params: object) -> str | None:
    """The run's stored form of `params` (JSON text, field order kept); None for none."""
    if params is None:
        return None
    assert dataclasses.is_dataclass(params) and not isinstance(params, type)
    text = json.dumps({f.name: _jsonable(getattr(params, f.name))
                       for f in dataclasses.fields(params) if f.init})
    if len(text) > MAX_JSON:
        raise InvalidParams(f"parameters take {len(text)} characters as JSON (at most "
                            f"{MAX_JSON})")
    return text


def values_of(stored: str | None) -> dict[str, Any] | None:
    """A run's stored parameters as a dict of JSON values (None: none stored)."""
    return json.loads(stored) if stored else None


def as_text(values: Mapping[str, Any] | None) -> str:
    """Parameters as an operator types them: `tenant=42 since=2026-01-01` (None: empty),
    or `-` for none."""
    if not values:
        return "-"
    return " ".join(f"{k}={'' if v is None else v}" for k, v in values.items())


def decode(job: str, cls: type | None, text: str | None) -> Any:
    """The instance a run's stored parameters describe (None if the job declares none); a
    run stored without any is built from the defaults."""
    if cls is None:
        return None
    return build(job, cls, json.loads(text) if text else {})
