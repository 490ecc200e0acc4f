"""Strict conversion between frozen dataclasses and plain YAML/JSON data.

Why hand-written and not pydantic: the schemas are a dozen small frozen dataclasses, and what users need
from loading is one precise sentence per mistake ("plan.yaml: stages[2].recompute: expected one of ...").
The rules are simple: every field the dataclass declares without a default is required, unknown keys are
refused (never ignored), values are checked against the type hints, and each class's ``validate()`` then
checks the values against each other. Loading never repairs anything.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import types
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from autoplan.errors import SpecError

T = TypeVar("T")


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build ``cls`` from ``data``; raise SpecError naming the dotted field path on any mismatch."""
    if not isinstance(data, dict):
        raise SpecError(f"{where or 'document'}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(f"{_join(where, unknown[0])}: unknown key (allowed: {', '.join(fields)})")
    kwargs = {}
    for name, field in fields.items():
        path = _join(where, name)
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise SpecError(f"{path}: missing required key")
            continue
        kwargs[name] = _convert(hints[name], data[name], path)
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check is not None:
        try:
            check()
        except SpecError as err:
            raise SpecError(f"{_join(where, str(err))}" if where else str(err)) from None
    return obj


def _join(where: str, name: str) -> str:
    if not where:
        return name
    return f"{where}{name}" if name.startswith("[") else f"{where}.{name}"


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(option, value, path)
            except SpecError as err:
                errors.append(str(err))
        raise SpecError(errors[0] if len(errors) == 1 else f"{path}: {value!r} does not fit {hint}")
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            raise SpecError(f"{path}: {value!r} is not allowed; use one of {', '.join(map(str, allowed))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{path}: expected a list, got {type(value).__name__}")
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise SpecError(f"{path}: expected a list of {len(args)} values, got {len(value)}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{path}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{path}: expected a whole number, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(f"{path}: expected text, got {value!r}")
        return value
    raise TypeError(f"unsupported schema type {hint!r} at {path}")  # a bug in a schema, not user input


def to_dict(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) for YAML/JSON, keeping field order."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def read_yaml(path: str | os.PathLike) -> Any:
    """Parse a YAML file; a missing file or bad syntax is a SpecError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such file")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise SpecError(f"{p}: not valid YAML{line}") from None


def load_yaml(cls: type[T], path: str | os.PathLike) -> T:
    """Read ``path`` as ``cls``; every error names the file and the field."""
    data = read_yaml(path)
    try:
        return from_dict(cls, data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None


class _Dumper(yaml.SafeDumper):
    """Short lists of scalars print on one line (layer ranges, per-stage values), the rest as blocks."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(v, (dict, list)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump_yaml(obj: Any, header: str = "") -> str:
    """YAML text of a dataclass or of plain data, keys in the order given."""
    return header + yaml.dump(to_dict(obj), Dumper=_Dumper, sort_keys=False, width=110)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves a half-written file behind."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def require(condition: bool, field: str, message: str) -> None:
    """Raise a SpecError for ``field`` unless ``condition`` holds; used by the ``validate`` methods."""
    if not condition:
        raise SpecError(f"{field}: {message}")

