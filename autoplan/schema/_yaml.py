"""Strict YAML parsing: the YAML 1.2 core schema, duplicate keys refused, size/depth/alias limits.

Why not plain ``yaml.safe_load``: PyYAML implements YAML 1.1, where ``1e9`` is text (1.2 and JSON read a
number), ``no``/``on`` are booleans and ``2024-01-01`` a date; it keeps the last of two equal keys
silently; its composer recurses once per nesting level (5,000 levels: RecursionError); and an alias
bomb ("billion laughs") builds a graph that any walk over the data expands exponentially. Here:

* plain scalars resolve as in the YAML 1.2 core schema: ``true``/``false``, ``null``/``~``, decimal,
  ``0o`` and ``0x`` integers, floats with or without a dot (``1e9``, ``.5``, ``.inf``, ``.nan``);
  everything else is text;
* a key that appears twice in one mapping is an error naming both lines;
* before anything is built, one pass over the parser's events (libyaml's, iterative) refuses nesting
  deeper than ``MAX_YAML_DEPTH`` and documents that expand (aliases counted in full) to more than
  ``MAX_YAML_VALUES`` values.
"""

from __future__ import annotations

import re

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import BaseResolver

from autoplan.schema.limits import MAX_YAML_DEPTH, MAX_YAML_VALUES

try:
    from yaml.cyaml import CParser as _Parser  # libyaml: 10x faster, and an iterative parser
except ImportError:  # PyYAML built without libyaml
    _Parser = None


class YamlProblem(Exception):
    """A mistake in the YAML text itself; ``line`` is 1-based (0 when unknown)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


class _Core12Resolver(BaseResolver):
    """Implicit tags of the YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution)."""


_Core12Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Core12Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_Core12Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))
_Core12Resolver.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
_Core12Resolver.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])


class _StrictConstructor(SafeConstructor):
    def construct_yaml_int(self, node) -> int:
        text = self.construct_scalar(node)
        sign, digits = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
        if len(digits) > 400:  # Python refuses to convert more than 4,300 digits; no real value has 400
            raise YamlProblem(f"a number of {len(digits):,} digits; no real value has so many",
                              node.start_mark.line + 1)
        if digits[:2] in ("0o", "0x"):
            return sign * int(digits[2:], 8 if digits[1] == "o" else 16)
        return sign * int(digits, 10)

    def construct_yaml_float(self, node) -> float:
        text = self.construct_scalar(node).lower()
        if text.lstrip("+-") == ".inf":
            return float("-inf") if text.startswith("-") else float("inf")
        if text == ".nan":
            return float("nan")
        return float(text)

    def construct_yaml_bool(self, node) -> bool:
        return self.construct_scalar(node).lower() == "true"

    def construct_mapping(self, node, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue  # merged keys may be overridden (YAML merge semantics); non-scalar keys are refused later
                key = self.construct_object(key_node)
                if key in seen:
                    raise YamlProblem(f"duplicate key {key!r} (first on line {seen[key]}); keep one",
                                      key_node.start_mark.line + 1)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


for _tag, _fn in (("int", _StrictConstructor.construct_yaml_int), ("float", _StrictConstructor.construct_yaml_float),
                  ("bool", _StrictConstructor.construct_yaml_bool)):
    _StrictConstructor.add_constructor(f"tag:yaml.org,2002:{_tag}", _fn)


if _Parser is not None:
    class StrictLoader(_Parser, _StrictConstructor, _Core12Resolver):
        def __init__(self, stream: str) -> None:
            _Parser.__init__(self, stream)
            _StrictConstructor.__init__(self)
            _Core12Resolver.__init__(self)
else:
    class StrictLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer,
                       _StrictConstructor, _Core12Resolver):
        def __init__(self, stream: str) -> None:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
            _StrictConstructor.__init__(self)
            _Core12Resolver.__init__(self)


class StrictDumper(yaml.emitter.Emitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter,
                   _Core12Resolver):
    """SafeDumper that quotes exactly the text a YAML 1.2 reader would take for something else ("1e9")."""

    def __init__(self, stream, default_style=None, default_flow_style=False, canonical=None, indent=None,
                 width=None, allow_unicode=None, line_break=None, encoding=None, explicit_start=None,
                 explicit_end=None, version=None, tags=None, sort_keys=True) -> None:
        yaml.emitter.Emitter.__init__(self, stream, canonical=canonical, indent=indent, width=width,
                                      allow_unicode=allow_unicode, line_break=line_break)
        yaml.serializer.Serializer.__init__(self, encoding=encoding, explicit_start=explicit_start,
                                            explicit_end=explicit_end, version=version, tags=tags)
        yaml.representer.SafeRepresenter.__init__(self, default_style=default_style,
                                                  default_flow_style=default_flow_style, sort_keys=sort_keys)
        _Core12Resolver.__init__(self)


def _check_shape(text: str) -> None:
    """Refuse deep nesting and alias bombs from the event stream, before any node is built."""
    open_counts: list[list] = []  # per open collection: [values inside so far, anchor]
    anchors: dict[str, int] = {}
    total = 0
    loader = StrictLoader(text)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                open_counts.append([1, event.anchor])
                if len(open_counts) > MAX_YAML_DEPTH:
                    raise YamlProblem(f"nested deeper than {MAX_YAML_DEPTH} levels", event.start_mark.line + 1)
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                count, anchor = open_counts.pop()
            elif isinstance(event, yaml.ScalarEvent):
                count, anchor = 1, event.anchor
            elif isinstance(event, yaml.AliasEvent):
                count, anchor = anchors.get(event.anchor, 1), None
            else:
                continue
            if anchor is not None:
                anchors[anchor] = count
            if open_counts:
                open_counts[-1][0] += count
                grown = open_counts[-1][0]
            else:
                total += count
                grown = total
            if grown > MAX_YAML_VALUES:
                raise YamlProblem(f"expands to more than {MAX_YAML_VALUES:,} values (aliases counted in full)",
                                  event.start_mark.line + 1)
    finally:
        loader.dispose()


def parse(text: str):
    """The one document in ``text`` as plain data; YamlProblem or yaml.YAMLError on a mistake."""
    _check_shape(text)
    loader = StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
