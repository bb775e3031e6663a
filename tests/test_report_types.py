"""The report schema says what the result dataclasses say: a pure walk of the types, no command runs.

Every command's result type is walked field by field beside its ``$defs`` entry of
``jaxdbg/schema/report.schema.json``: the same JSON names (``field(metadata={"json": ...})`` included), all of
them required and no others allowed, null allowed exactly where the type is optional, and the same kind of
value (boolean, integer, float (a number or ``"nan"``/``"inf"``/``"-inf"``: ``$defs/float``), string, a
``Literal``'s values as the schema's ``enum``, list, object, mapping), down through nested dataclasses, lists
and dicts. A field renamed, added, dropped, made optional or retyped on one side fails here. What a type leaves
open (``Any``, ``dict[str, Any]``) only the schema describes: those places are listed in ``UNTYPED``.

Every field name of a command's result also appears in its section of ``docs/report.md``.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from jaxdbg.check.result import CheckSuiteResult
from jaxdbg.doctor import DoctorResult
from jaxdbg.hang.result import HangResult
from jaxdbg.live.watch import RecompileResult
from jaxdbg.memory.result import MemoryResult
from jaxdbg.nan.result import NanHuntResult
from jaxdbg.pipeline.bench import BenchResult
from jaxdbg.profile.model import ProfileResult
from jaxdbg.repro.result import ReproResult
from jaxdbg.schema import schema

REPORT_MD = Path(__file__).resolve().parent.parent / "docs" / "report.md"

# $defs entry -> (result type, the section of docs/report.md that describes it)
RESULTS: dict[str, tuple[type, str]] = {
    "doctor_result": (DoctorResult, "doctor"),
    "profile_result": (ProfileResult, "profile"),
    "nan_hunt_result": (NanHuntResult, "nan-hunt"),
    "repro_result": (ReproResult, "repro"),
    "pipeline_bench_result": (BenchResult, "pipeline-bench"),
    "check_result": (CheckSuiteResult, "check"),
    "memory_result": (MemoryResult, "memory"),
    "hang_hunt_result": (HangResult, "hang-hunt"),
    "watch_recompiles_result": (RecompileResult, "watch"),
}

FLOAT_REF = "#/$defs/float"

# Where a result type says only Any / dict[str, Any] (a bare dict or tuple): the schema alone describes these.
UNTYPED = {
    "doctor_result.compilation_cache", "doctor_result.devices[]", "doctor_result.distributed", "doctor_result.host",
    "doctor_result.profiler", "pipeline_bench_result.config", "profile_result.capture.hosts[].overview",
    "profile_result.device", "profile_result.eager_compile", "profile_result.monitor.summary",
    "watch_recompiles_result.recompiles",
}


def _deref(node: dict, root: dict) -> dict:
    while "$ref" in node and node["$ref"] != FLOAT_REF:
        *_, name = node["$ref"].split("/")
        node = root["$defs"][name]
    return node


def _schema_alternatives(node: dict, root: dict) -> list[dict]:
    """The alternatives a schema node allows (anyOf, type lists and enums with null split up), $refs resolved."""
    node = _deref(node, root)
    if "anyOf" in node or "oneOf" in node:
        return [alt for part in node.get("anyOf") or node["oneOf"] for alt in _schema_alternatives(part, root)]
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    if "enum" in node and None in node["enum"]:
        rest = [value for value in node["enum"] if value is not None]
        return [{"type": "null"}, *([{**node, "enum": rest}] if rest else [])]
    if isinstance(node.get("type"), list):
        return [{**node, "type": kind} for kind in node["type"]]
    return [node]


def _schema_kind(node: dict) -> str:
    if node.get("$ref") == FLOAT_REF or node.get("type") == "number":
        return "float"
    if "enum" in node:
        return "enum"
    return node.get("type", "any")


def _type_alternatives(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return list(typing.get_args(tp))
    return [tp]


def _type_kind(tp: Any) -> str:
    origin = typing.get_origin(tp) or tp
    if tp is type(None):
        return "null"
    if origin is Literal:
        return "enum"
    if dataclasses.is_dataclass(tp) or origin is dict:
        return "object"
    if origin in (list, tuple):
        return "array"
    kinds = {bool: "boolean", int: "integer", float: "float", str: "string"}
    if tp in kinds:
        return kinds[tp]
    raise TypeError(f"no JSON kind for {tp!r}")


def _json_fields(cls: type) -> dict[str, Any]:
    """JSON name -> type of each field of a result dataclass that reaches the JSON."""
    hints = typing.get_type_hints(cls)
    return {field.metadata.get("json", field.name): hints[field.name] for field in dataclasses.fields(cls)
            if field.metadata.get("json", field.name) is not None}


class Walk:
    """Compares types with schema nodes, collecting the differences and the places no type describes."""

    def __init__(self, root: dict) -> None:
        self.root = root
        self.differences: list[str] = []
        self.untyped: set[str] = set()
        self.fields: dict[str, set[str]] = {}  # top-level $defs entry -> every JSON field name under it

    def differ(self, path: str, what: str) -> None:
        self.differences.append(f"{path}: {what}")

    def compare(self, tp: Any, node: dict, path: str) -> None:
        if tp is Any or tp in (dict, tuple):
            self.untyped.add(path)
            return
        by_kind: dict[str, list[dict]] = {}
        for alt in _schema_alternatives(node, self.root):
            by_kind.setdefault(_schema_kind(alt), []).append(alt)
        types_by_kind: dict[str, list[Any]] = {}
        for alt in _type_alternatives(tp):
            types_by_kind.setdefault(_type_kind(alt), []).append(alt)
        if set(by_kind) != set(types_by_kind):
            self.differ(path, f"the type allows {sorted(types_by_kind)}, the schema {sorted(by_kind)}")
            return
        for kind, alts in types_by_kind.items():
            if kind == "enum":  # Literal["a"] | Literal["b", "c"]: one set of values
                values = {value for alt in alts for value in typing.get_args(alt)}
                allowed = {value for node in by_kind[kind] for value in node["enum"]}
                if values != allowed:
                    self.differ(path, f"the type's values {sorted(values)} != the schema's enum {sorted(allowed)}")
            elif len(alts) != 1 or len(by_kind[kind]) != 1:
                self.differ(path, f"several {kind} alternatives")
            else:
                self.compare_kind(kind, alts[0], by_kind[kind][0], path)

    def compare_kind(self, kind: str, tp: Any, node: dict, path: str) -> None:
        if kind == "array":
            self.compare_array(tp, node, path)
        elif kind == "object" and isinstance(tp, type) and dataclasses.is_dataclass(tp):
            self.compare_dataclass(tp, node, path)
        elif kind == "object":
            self.compare_mapping(tp, node, path)

    def compare_array(self, tp: Any, node: dict, path: str) -> None:
        args = typing.get_args(tp)
        if typing.get_origin(tp) is tuple and args and args[-1] is not Ellipsis:
            if len(set(args)) != 1:
                self.differ(path, f"a tuple of mixed types {args}")
                return
            if (node.get("minItems"), node.get("maxItems")) != (len(args), len(args)):
                self.differ(path, f"the type holds exactly {len(args)} items, the schema does not say so")
        self.compare(args[0] if args else Any, node.get("items", {}), f"{path}[]")

    def compare_mapping(self, tp: Any, node: dict, path: str) -> None:
        _, value = typing.get_args(tp)
        if value is Any:
            self.untyped.add(path)
            return
        extra = node.get("additionalProperties", {})
        for name, child in node.get("properties", {}).items():
            self.compare(value, child, f"{path}.{name}")
        if extra is not False:
            self.compare(value, extra, f"{path}.*")

    def compare_dataclass(self, cls: type, node: dict, path: str) -> None:
        fields = _json_fields(cls)
        self.fields.setdefault(path.split(".")[0].split("[")[0], set()).update(fields)
        properties = node.get("properties", {})
        if set(fields) != set(properties):
            only_type, only_schema = sorted(set(fields) - set(properties)), sorted(set(properties) - set(fields))
            self.differ(path, f"{cls.__name__} has {only_type} that the schema lacks, the schema {only_schema} "
                              f"that the type lacks")
        if set(node.get("required", ())) != set(fields):
            self.differ(path, f"required {sorted(node.get('required', ()))} != the fields {sorted(fields)}")
        if node.get("additionalProperties") is not False:
            self.differ(path, "the schema allows keys besides the fields")
        for name in fields.keys() & properties.keys():
            self.compare(fields[name], properties[name], f"{path}.{name}")


@pytest.fixture(scope="module")
def walk() -> Walk:
    root = schema()
    found = Walk(root)
    for name, (cls, _) in RESULTS.items():
        found.compare(cls, {"$ref": f"#/$defs/{name}"}, name)
    return found


def test_the_schema_says_what_the_result_types_say(walk: Walk) -> None:
    assert not walk.differences, "\n".join(walk.differences)


def test_what_the_types_leave_open_is_known(walk: Walk) -> None:
    """Fields typed ``Any``/``dict[str, Any]``: the schema alone describes their insides (type them to have them
    checked here, and take them off this list)."""
    assert walk.untyped == UNTYPED


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


@pytest.mark.parametrize("name", sorted(RESULTS))
def test_every_field_is_in_report_md(name: str, walk: Walk) -> None:
    """Each JSON field name of a command's result is named in that command's section of docs/report.md, as
    `field` or as "field" inside a code span (`{"argument", "kind", "before", "after"}`); a source location's
    fields are named once, under Conventions."""
    text = REPORT_MD.read_text()
    section = _section(text, RESULTS[name][1]) + _section(text, "Conventions")
    named = set(re.findall(r"`([A-Za-z_]\w*)`", section))
    named |= {word for span in re.findall(r"`[^`]*`", section) for word in re.findall(r'"([A-Za-z_]\w*)"', span)}
    assert not walk.fields[name] - named, sorted(walk.fields[name] - named)


def test_every_result_in_the_schema_is_walked() -> None:
    results = {name for name in schema()["$defs"] if name.endswith("_result")}
    assert results - set(RESULTS) == {"error_result"}  # {"error": "..."}: a dict, no dataclass
