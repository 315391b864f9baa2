"""Dataclasses built from untrusted JSON (a record file's events), every field checked against its
annotation: a wrong type, a missing or unknown field is a :class:`TypeError` naming the field,
never a half-built event that fails later, far from the file and line it came from."""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache


@cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def build(cls: type, data: object, where: str = ""):
    """``cls(**data)`` with each value checked (and nested dataclasses built) per its annotation."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise TypeError(f"{where}: an object was expected, not {type(data).__name__}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in data if k not in names)
    if unknown:
        raise TypeError(f"{where}: unknown field(s) {', '.join(unknown)}")
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = sorted(required - set(data))
    if missing:
        raise TypeError(f"{where}: missing field(s) {', '.join(missing)}")
    return cls(**{k: convert(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def convert(hint: object, value: object, where: str) -> object:
    """``value`` if it is a ``hint`` (an int where a float is asked is one), else TypeError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return convert(arg, value, where)
            except TypeError:
                continue
        raise TypeError(f"{where}: {type(value).__name__} is not {_name(hint)}")
    if origin is list:
        if not isinstance(value, list):
            raise TypeError(f"{where}: {type(value).__name__} is not a list")
        if not args or (args[0] in (str, dict) and set(map(type, value)) <= {args[0]}):
            return value  # a log batch: many lines, checked at C speed
        return [convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if _is(hint, value):
        return value
    raise TypeError(f"{where}: {type(value).__name__} is not {_name(hint)}")


def _is(hint: object, value: object) -> bool:
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool, dict):
        return isinstance(value, hint)
    return False  # an annotation this module does not know: refused, not trusted


def _name(hint: object) -> str:
    return getattr(hint, "__name__", None) or str(hint)
