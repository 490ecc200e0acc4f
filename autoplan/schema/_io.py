"""Strict conversion between frozen dataclasses and plain YAML/JSON data.

Why hand-written and not pydantic: the schemas are a dozen small frozen dataclasses, and what users need
from loading is one precise sentence per mistake ("plan.yaml: stages[2].recompute: expected one of ...").
The rules are simple: every field the dataclass declares without a default is required, unknown keys are
refused (never ignored), values are checked against the type hints, and each class's ``validate()`` then
checks the values against each other. Loading never repairs anything.

Checks every field gets from its type alone (so fields added later are covered without a line of code):
a ``float`` must be finite, an ``int`` must fit in 64 bits, text must be one line of at most
``MAX_TEXT_CHARS``. ``require_physical`` adds the rules a unit suffix implies (``_tflops`` > 0, ...).
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from autoplan.errors import SpecError
from autoplan.schema._files import check_writable, read_text, write_atomic  # noqa: F401  (re-exported)
from autoplan.schema._yaml import StrictDumper, YamlProblem, parse
from autoplan.schema.limits import MAX_TEXT_CHARS

T = TypeVar("T")
_INT64 = 2**63


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build ``cls`` from ``data``; raise SpecError naming the dotted field path on any mismatch."""
    if not isinstance(data, dict):
        raise SpecError(f"{where or 'document'}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted((k for k in data if k not in fields), key=str)
    if unknown:
        raise SpecError(f"{_join(where, _key(unknown[0]))}: unknown key (allowed: {', '.join(fields)})")
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


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 60, 60


def _show(value: Any, width: int = 60) -> str:
    """A value for an error message: a bounded repr (an alias bomb is never expanded), one line."""
    text = _REPR.repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _key(key: Any) -> str:
    text = key if isinstance(key, str) and key.isprintable() else repr(key)
    return text if len(text) <= 40 else text[:37] + "..."


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
        raise SpecError(errors[0] if len(errors) == 1 else f"{path}: {_show(value)} does not fit {hint}")
    if origin is Literal:
        allowed = get_args(hint)
        if isinstance(value, (dict, list)) or value not in allowed or isinstance(value, bool) != any(
                isinstance(a, bool) for a in allowed):
            raise SpecError(f"{path}: {_show(value)} is not allowed; use one of {', '.join(map(str, allowed))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{path}: expected a list, got {_show(value)}")
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
            raise SpecError(f"{path}: expected true or false, got {_show(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{path}: expected a whole number, got {_show(value)}")
        if not -_INT64 <= value < _INT64:
            raise SpecError(f"{path}: {_show(value, 30)} is out of range (a 64-bit integer)")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{path}: expected a number, got {_show(value)}")
        if isinstance(value, int) and not -_INT64 <= value < _INT64:
            raise SpecError(f"{path}: {_show(value, 30)} is out of range")
        if not math.isfinite(value):
            raise SpecError(f"{path}: {value} is not a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(f"{path}: expected text, got {_show(value)}")
        if len(value) > MAX_TEXT_CHARS:
            raise SpecError(f"{path}: {len(value)} characters; at most {MAX_TEXT_CHARS} are allowed")
        if not value.isprintable():
            raise SpecError(f"{path}: {_show(value)} holds a line break or a control character; use one line")
        return value
    raise TypeError(f"unsupported schema type {hint!r} at {path}")  # a bug in a schema, not user input


def to_dict(obj: Any) -> Any:
    """Plain data (dicts, lists, scalars) for YAML/JSON, keeping field order. A dataclass with a
    ``defaults_omitted()`` method (name -> value) loses those fields while they hold those values: fields
    added to a schema later, so files, fingerprints and hashes of objects that do not use them stay as
    they were (``from_dict`` restores the defaults)."""
    if dataclasses.is_dataclass(obj):
        omitted = obj.defaults_omitted() if hasattr(obj, "defaults_omitted") else {}
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.name in omitted and getattr(obj, f.name) == omitted[f.name])}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def read_yaml(path: str | os.PathLike) -> Any:
    """Parse a YAML file strictly (``_yaml``, ``_files``); every mistake is a SpecError naming the file."""
    text = read_text(path)
    try:
        return parse(text)
    except YamlProblem as err:
        line = f" (line {err.line})" if err.line else ""
        raise SpecError(f"{path}: not valid YAML{line}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or ""
        raise SpecError(f"{path}: not valid YAML{line}" + (f": {_show(problem, 100)}" if problem else "")) from None


def load_yaml(cls: type[T], path: str | os.PathLike) -> T:
    """Read ``path`` as ``cls``; every error names the file and the field."""
    data = read_yaml(path)
    try:
        return from_dict(cls, data)
    except SpecError as err:
        raise SpecError(f"{path}: {err}") from None


class _Dumper(StrictDumper):
    """Short lists of scalars print on one line (layer ranges, per-stage values), the rest as blocks."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(not isinstance(v, (dict, list)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump_yaml(obj: Any, header: str = "") -> str:
    """YAML text of a dataclass or of plain data, keys in the order given."""
    return header + yaml.dump(to_dict(obj), Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)


def require(condition: bool, field: str, message: str) -> None:
    """Raise a SpecError for ``field`` unless ``condition`` holds; used by the ``validate`` methods."""
    if not condition:
        raise SpecError(f"{field}: {message}")



def require_range(obj: Any, field: str, low: float | None = None, high: float | None = None,
                  low_open: bool = False) -> None:
    """``field`` of ``obj`` lies in [low, high] (``(low, high]`` with ``low_open``); None (unset) passes."""
    value = getattr(obj, field)
    if value is None:
        return
    if low is not None and (value <= low if low_open else value < low):
        raise SpecError(f"{field}: {value} must be {'more than' if low_open else 'at least'} {_num(low)}")
    if high is not None and value > high:
        raise SpecError(f"{field}: {value} must be at most {_num(high)}")


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


UNIT_RULES: tuple[tuple[str, float, bool, float], ...] = (
    # (name suffix, lowest, lowest excluded?, highest): what a quantity with this unit can physically be
    ("_efficiency", 1e-3, False, 1.0),     # a share of peak: from 0.1%
    ("_tflops", 1e-9, False, 1e6),         # 10^12 FLOP/s: from 1 kFLOP/s; the fastest device in 2024 does ~2e3
    ("_per_s", 1e-6, False, 1e9),          # bandwidths (_gb_per_s: from 1 KB/s) and rates (_gparams_per_s)
    ("_gib", 0.0, True, 1e6),              # memory of one device
    ("_gflop", 0.0, False, 1e12),
    ("_flops", 0, False, _INT64 - 1),
    ("_bytes", 0, False, _INT64 - 1),
    ("_us", 0.0, False, 1e8),              # latencies, overheads
    ("_s", 0.0, False, 1e9),               # measured times
)


def require_physical(obj: Any, zero_means_absent: tuple[str, ...] = ()) -> None:
    """Every numeric field of ``obj`` whose name ends in a unit (``UNIT_RULES``) lies in that unit's range,
    so a field added later (``peak_fp8_tflops``) is checked without a line of code. Fields named in
    ``zero_means_absent`` may also be exactly 0 ("this device has no such kernel" / "not measured")."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if f.name in zero_means_absent and value == 0:
            continue
        for suffix, low, low_open, high in UNIT_RULES:
            if f.name.endswith(suffix):
                require_range(obj, f.name, low, high, low_open)
                break


def validated(obj: T, flags: dict[str, str] | None = None) -> T:
    """``obj`` (built in code, e.g. from command-line options) checked exactly as if it had been loaded
    from a file; ``flags`` maps field names to the option that set them, for the message."""
    try:
        return from_dict(type(obj), to_dict(obj))
    except SpecError as err:
        text = str(err)
        for name, flag in (flags or {}).items():
            if text.startswith(f"{name}:"):
                text = flag + text[len(name):]
                break
        raise SpecError(text) from None
