"""Generate :mod:`spark_sink.protocol.kmsg` from Kafka's own message definitions.

Kafka ships the definition of every request and response as JSON in the kafka-clients
jar (``common/message/*.json``): versions, flexible versions, nullable and tagged fields,
defaults. This reads the definitions of the APIs kprod speaks (``VERSIONS`` in
:mod:`spark_sink.protocol.apis`, read from its source so that a stale or missing
``kmsg.py`` cannot stop its own regeneration), clipped to the versions kprod implements,
and the request and response headers (``HEADERS``), and writes typed classes and the
codec's tables::

    python -m spark_sink.protocol.generate path/to/kafka-clients-X.jar [-o out.py]

``make kmsg`` runs it on the jar of the Kafka the suite fetches
(``kprod_broker.kafka_clients_jar()``). Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
APIS_PY = _HERE / "apis.py"
OUTPUT = _HERE / "kmsg.py"
_MAX = 32767
_PRIMITIVES = {"int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "bool", "string", "bytes",
               "records", "uuid"}
_PY_TYPES = {"int8": "int", "int16": "int", "uint16": "int", "int32": "int", "uint32": "int", "int64": "int",
             "float64": "float", "bool": "bool", "string": "str", "bytes": "bytes", "records": "Records",
             "uuid": "uuid.UUID"}

Range = tuple[int, int]

# The header versions kprod writes and reads (framing.py): request header v1 (v2 for a
# flexible request), response header v0 (v1 for a flexible response but ApiVersions').
HEADERS: dict[str, Range] = {"RequestHeader": (1, 2), "ResponseHeader": (0, 1)}


class DefinitionError(ValueError):
    """A message definition this generator cannot turn into kprod's tables."""


def strip_comments(text: str) -> str:
    """Kafka's JSON with its ``//`` comments removed (outside strings)."""
    out, i, in_string = [], 0, False
    while i < len(text):
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif text.startswith("//", i):
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def parse_versions(text: str | None, what: str) -> Range | None:
    """``"3+"``, ``"2-7"``, ``"5"`` or ``"none"`` as an inclusive range (None for none)."""
    if text is None or text == "none":
        return None
    m = re.fullmatch(r"(\d+)(\+|-(\d+))?", text.strip())
    if not m:
        raise DefinitionError(f"{what}: versions {text!r} are not N, N+ or A-B")
    low = int(m.group(1))
    high = _MAX if m.group(2) == "+" else int(m.group(3)) if m.group(3) else low
    return low, high


def _clip(r: Range | None, within: Range) -> Range | None:
    if r is None:
        return None
    low, high = max(r[0], within[0]), min(r[1], within[1])
    return (low, high) if low <= high else None


def snake(name: str) -> str:
    """Kafka's CamelCase field names as kprod's attributes: ``ThrottleTimeMs`` ->
    ``throttle_time_ms``, ``ResultsByTopicV3AndBelow`` -> ``results_by_topic_v3_and_below``."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()


def implemented_versions(apis_py: Path = APIS_PY) -> dict[str, tuple[int, Range]]:
    """``{ApiKey member name: (api key, (min, max))}`` from ``ApiKey`` and ``VERSIONS`` in
    apis.py, read from its source."""
    tree = ast.parse(apis_py.read_text(), str(apis_py))
    keys: dict[str, int] = {}
    versions: dict[str, Range] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ApiKey":
            for item in node.body:
                if (isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
                        and isinstance(item.targets[0], ast.Name) and isinstance(item.value.value, int)):
                    keys[item.targets[0].id] = item.value.value
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "VERSIONS":
            assert isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                if not isinstance(k, ast.Attribute):
                    raise DefinitionError(f"{apis_py}: VERSIONS keys must be ApiKey.NAME")
                versions[k.attr] = ast.literal_eval(v)
    if not keys or not versions:
        raise DefinitionError(f"{apis_py}: no ApiKey class or VERSIONS table")
    return {name: (keys[name], versions[name]) for name in versions}


@dataclass
class _Field:
    name: str  # snake_case attribute
    type: str  # schema type: primitive, []primitive, []struct, struct
    versions: Range
    default: str  # a Python expression
    py_type: str
    factory: str | None = None  # default_factory for the dataclass
    struct: _Struct | None = None
    nullable: Range | None = None
    tag: int | None = None
    tagged: Range | None = None
    ignorable: bool = False  # may be left out of a version that lacks it even when not at its default
    own_flexible: bool = False  # has its own flexibleVersions (then ``flexible``)
    flexible: Range | None = None


@dataclass
class _Struct:
    name: str  # Kafka's struct (or message) name
    fields: list[_Field] = field(default_factory=list)
    cls: str = ""  # Python class name, set once names are known


@dataclass
class _Message:
    api: str  # ApiKey member name (for a header, its constant: REQUEST_HEADER)
    key: int  # -1 for a header
    kind: str  # "request", "response" or "header"
    json_name: str
    valid: Range
    versions: Range
    flexible: Range | None
    root: _Struct


def load_definitions(jar: Path) -> dict[tuple[int | str, str], dict]:
    """Every request and response definition in ``jar``, by (api key, "request"/"response"),
    and every header's, by (name, "header")."""
    found: dict[tuple[int | str, str], dict] = {}
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            if name.startswith("common/message/") and name.endswith(".json"):
                data = json.loads(strip_comments(z.read(name).decode()))
                if data.get("type") in ("request", "response"):
                    found[(data["apiKey"], data["type"])] = data
                elif data.get("type") == "header":
                    found[(data["name"], "header")] = data
    if not found:
        raise DefinitionError(f"{jar}: no common/message/*.json definitions in it")
    return found


def _default(f: dict, type_: str, nullable: Range | None, what: str) -> str:
    raw = f.get("default")
    if raw == "null":
        if nullable is None:
            raise DefinitionError(f"{what}: default null but never nullable")
        return "None"
    if type_.startswith("[]"):
        return "[]"
    if type_ in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return str(int(raw, 0)) if isinstance(raw, str) else str(int(raw or 0))
    if type_ == "float64":
        return repr(float(raw or 0))
    if type_ == "bool":
        return "True" if raw in (True, "true") else "False"
    if type_ == "string":
        return json.dumps(raw or "")
    if type_ == "bytes":
        return 'b""'
    if type_ == "records":
        return "None"
    if type_ == "uuid":
        return "ZERO_UUID"
    raise DefinitionError(f"{what}: no default for type {type_}")


def _struct(name: str, fields: list[dict], within: Range, commons: dict[str, dict], what: str) -> _Struct:
    out = _Struct(name)
    for f in fields:
        fwhat = f"{what}.{f['name']}"
        versions = _clip(parse_versions(f["versions"], fwhat), within)
        if versions is None:
            continue
        own_flexible = "flexibleVersions" in f
        if own_flexible and f["type"] not in ("string", "bytes"):
            # Kafka allows its own flexibleVersions on a string or bytes field only (the
            # request header's ClientId keeps its two-byte length in flexible versions).
            raise DefinitionError(f"{fwhat}: field-level flexibleVersions on a {f['type']} field")
        nullable = _clip(parse_versions(f.get("nullableVersions"), fwhat), versions)
        tagged = _clip(parse_versions(f.get("taggedVersions"), fwhat), versions)
        if tagged is not None and tagged != versions:
            raise DefinitionError(f"{fwhat}: tagged in {tagged} but present in {versions}")
        kafka_type: str = f["type"]
        is_array = kafka_type.startswith("[]")
        item = kafka_type[2:] if is_array else kafka_type
        struct = None
        if item in _PRIMITIVES:
            type_, py = kafka_type, _PY_TYPES[item]
            py = f"list[{py}]" if is_array else py
        else:
            body = f.get("fields") or commons.get(item, {}).get("fields")
            if body is None:
                raise DefinitionError(f"{fwhat}: struct {item} has no fields")
            struct = _struct(item, body, versions, commons, f"{what}.{item}")
            type_, py = ("[]struct", f"list[{item}]") if is_array else ("struct", item)
            if not is_array and nullable is not None:
                raise DefinitionError(f"{fwhat}: nullable structs are not supported")
        factory = None
        if type_ == "struct":
            # A tagged struct the message leaves out is None; a plain one is there, at its defaults.
            default, factory = ("None", None) if tagged else ("", item)
        else:
            default = _default(f, type_, nullable, fwhat)
            if default == "[]":
                factory = "list"
        if default == "None" or nullable is not None:
            py += " | None"
        out.fields.append(_Field(snake(f["name"]), type_, versions, default, py, factory, struct, nullable,
                                 f.get("tag"), tagged, bool(f.get("ignorable", False)), own_flexible,
                                 _clip(parse_versions(f.get("flexibleVersions"), fwhat), versions)
                                 if own_flexible else None))
    return out


def build(jar: Path, apis_py: Path = APIS_PY) -> list[_Message]:
    """The messages kprod speaks, read from ``jar`` and clipped to its versions."""
    definitions = load_definitions(jar)
    messages = []
    for api, (key, wanted) in implemented_versions(apis_py).items():
        for kind in ("request", "response"):
            data = definitions.get((key, kind))
            if data is None:
                raise DefinitionError(f"{jar.name}: no {kind} definition for API key {key} ({api})")
            valid = parse_versions(data["validVersions"], data["name"])
            assert valid is not None
            if not (valid[0] <= wanted[0] and wanted[1] <= valid[1]):
                raise DefinitionError(f"{data['name']}: kprod implements v{wanted[0]}-v{wanted[1]}, "
                                      f"{jar.name} defines v{valid[0]}-v{valid[1]}")
            commons = {s["name"]: s for s in data.get("commonStructs", ())}
            root = _struct(data["name"], data["fields"], wanted, commons, data["name"])
            messages.append(_Message(api, key, kind, data["name"], valid, wanted,
                                     _clip(parse_versions(data["flexibleVersions"], data["name"]), wanted), root))
    for name, wanted in HEADERS.items():
        data = definitions.get((name, "header"))
        if data is None:
            raise DefinitionError(f"{jar.name}: no {name} definition")
        valid = parse_versions(data["validVersions"], name)
        assert valid is not None
        if not (valid[0] <= wanted[0] and wanted[1] <= valid[1]):
            raise DefinitionError(f"{name}: kprod uses v{wanted[0]}-v{wanted[1]}, {jar.name} defines "
                                  f"v{valid[0]}-v{valid[1]}")
        root = _struct(name, data["fields"], wanted, {}, name)
        messages.append(_Message(snake(name).upper(), -1, "header", name, valid, wanted,
                                 _clip(parse_versions(data["flexibleVersions"], name), wanted), root))
    _name_classes(messages)
    return messages


def _walk(struct: _Struct) -> Iterator[_Struct]:
    """``struct`` and every struct inside it, innermost first."""
    for f in struct.fields:
        if f.struct is not None:
            yield from _walk(f.struct)
    yield struct


def _name_classes(messages: list[_Message]) -> None:
    """Class names: Kafka's struct names, prefixed with the message's name where two
    messages use the same struct name."""
    owners: dict[str, set[str]] = {}
    for m in messages:
        for s in _walk(m.root):
            owners.setdefault(s.name, set()).add(m.json_name)
    for m in messages:
        for s in _walk(m.root):
            s.cls = s.name if s is m.root or len(owners[s.name]) == 1 else m.json_name + s.name
        for s in _walk(m.root):
            for f in s.fields:
                if f.struct is not None:
                    f.py_type = f.py_type.replace(f.struct.name, f.struct.cls)
                    if f.factory == f.struct.name:
                        f.factory = f.struct.cls


def _span(r: Range) -> str:
    return f"v{r[0]}" if r[0] == r[1] else f"v{r[0]}-v{r[1]}"


def _class_source(s: _Struct, doc: str, reply: str | None = None) -> list[str]:
    """A struct's dataclass; a request's says which class its reply is (``reply``)."""
    base = f"(Request[\"{reply}\"])" if reply else ""  # quoted: the reply is defined after it
    lines = ["", "", "@dataclass(slots=True)", f"class {s.cls}{base}:", f'    """{doc}"""', ""]
    for f in s.fields:
        if f.factory is not None:
            lines.append(f"    {f.name}: {f.py_type} = field(default_factory={f.factory})")
        else:
            lines.append(f"    {f.name}: {f.py_type} = {f.default}")
    if not s.fields:
        lines.append("    pass")
    return lines


def _fields_source(s: _Struct, indent: str) -> list[str]:
    lines = []
    for f in s.fields:
        args = [json.dumps(f.name), json.dumps(f.type), str(f.versions[0]), str(f.versions[1])]
        default = "[]" if f.factory == "list" else f"{f.factory}()" if f.factory is not None else f.default
        if default != "0":
            args.append(f"default={default}")
        if f.nullable is not None:
            args.append(f"nullable={f.nullable}")
        if f.tag is not None:
            args += [f"tag={f.tag}", f"tagged={f.tagged}"]
        if f.ignorable:
            args.append("ignorable=True")
        if f.own_flexible:
            args.append(f"flexible={f.flexible}")
        if f.struct is None:
            lines.append(f"{indent}F({', '.join(args)}),")
        else:
            lines.append(f"{indent}F({', '.join(args)}, schema=Schema({f.struct.cls}, (")
            lines += _fields_source(f.struct, indent + "    ")
            lines.append(f"{indent}))),")
    return lines


def constant(m: _Message) -> str:
    """The module constant holding a message's schema: PRODUCE_REQUEST, ..., REQUEST_HEADER."""
    return m.api if m.kind == "header" else f"{m.api}_{m.kind.upper()}"


def render(messages: list[_Message], jar_name: str) -> str:
    """The source of kmsg.py."""
    lines = [
        '"""Kafka\'s request and response definitions for the APIs kprod speaks, as typed classes and',
        "the tables of :mod:`spark_sink.protocol.schema`'s codec.",
        "",
        f"Generated from common/message/*.json in {jar_name} by ``python -m spark_sink.protocol.generate``",
        "(versions clipped to ``apis.VERSIONS``): do not edit.",
        '"""',
        "",
        "# generated, do not edit",
        "from __future__ import annotations",
        "",
        "import uuid",
        "from dataclasses import dataclass, field",
        "",
        "from spark_sink.protocol.schema import Field as F",
        "from spark_sink.protocol.schema import Records, Request, Schema",
        "",
        "ZERO_UUID = uuid.UUID(int=0)",
    ]
    apis = [m for m in messages if m.kind != "header"]
    replies = {req.root.cls: resp.root.cls for req, resp in zip(apis[::2], apis[1::2], strict=True)}
    for m in messages:
        for s in _walk(m.root):
            if s is m.root and m.kind == "header":
                doc = f"{m.json_name}: kprod uses {_span(m.versions)} of Kafka's {_span(m.valid)}."
            elif s is m.root:
                doc = f"{m.json_name} (API key {m.key}): kprod speaks {_span(m.versions)} of Kafka's {_span(m.valid)}."
            else:
                doc = f"{s.name} in {m.json_name}."
            lines += _class_source(s, doc, replies.get(s.cls) if s is m.root else None)
    for m in messages:
        flexible = f", flexible_from={m.flexible[0]}" if m.flexible else ""
        flexible += f", versions={m.versions}"
        lines += ["", "", f"{constant(m)} = Schema({m.root.cls}, ("]
        lines += _fields_source(m.root, "    ")
        lines.append(f"){flexible})")
    lines += ["", "", "# The request and response schemas of each API, by API key.",
              "SCHEMAS: dict[int, tuple[Schema, Schema]] = {"]
    for req, resp in zip(apis[::2], apis[1::2], strict=True):
        lines.append(f"    {req.key}: ({constant(req)}, {constant(resp)}),  # {req.api}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_sink.protocol.generate", description=__doc__.split("\n")[0])
    parser.add_argument("jar", type=Path, help="the kafka-clients jar (make kmsg passes kprod_broker's)")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT, help=f"default: {OUTPUT}")
    args = parser.parse_args(argv)
    args.output.write_text(render(build(args.jar), args.jar.name))
    print(f"wrote {args.output} from {args.jar}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
