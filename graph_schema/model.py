"""The multi-stage graph file (multistage_config.json): data model, parse, load and save.

Parsing checks only the structure (types, required and unknown keys); what the graph means
(references, cycles, terminals, runners, artifacts) is checked by ``validate``. Both raise the
one error type of this package, ``GraphError``, which carries the JSON path of the fault so a
hand-edited file can be fixed without guessing.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

SCHEMA_VERSION = 1
GRAPH_FILENAME = "multistage_config.json"
REQUEST = "request"  # the prefix of a request field source, as in "request:messages"
ON_MISSING = ("skip", "fail", "prune")
# How a port's data travels. TensorRT Edge-LLM's parser defaults to device_tensor; edgeomni
# writes transport explicitly and applies chunk_stream when it is absent. Its runtime treats
# both alike: whether a consumer reads a port while it is made is --stage-streaming's choice.
TRANSPORTS = ("chunk_stream", "device_tensor")
DEFAULT_TRANSPORT = "chunk_stream"
# What a port carries; an emit without "kind" carries text, as in TensorRT Edge-LLM.
EMIT_KINDS = ("text", "hidden", "codec", "audio", "image", "video")
DEFAULT_EMIT_KIND = "text"


class GraphError(ValueError):
    """The one error of graph_schema: what is wrong (``message``) and where (``path``).

    ``path`` is a JSON path such as ``$.stages[1].inputs[0].from``, so editors and humans can
    jump to the fault.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message

    def __reduce__(self) -> tuple[type[GraphError], tuple[str, str]]:  # keep it picklable across processes despite the 2-arg __init__
        return (type(self), (self.path, self.message))


def _freeze(value: Any) -> Any:
    """Make config values read-only (objects become mappings, arrays become tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """Inverse of ``_freeze``: plain dicts and lists for ``json``."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


def _empty_config() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Input:
    """One input of a stage: ``source`` is ``request:<field>`` or ``<stage>:<port>``."""

    name: str
    source: str  # JSON key "from" (a Python keyword)
    on_missing: str = "fail"

    @property
    def request_field(self) -> str | None:
        """The request field this input reads, or None when it reads a stage."""
        head, sep, tail = self.source.partition(":")
        return tail if sep and head == REQUEST else None

    @property
    def upstream(self) -> tuple[str, str] | None:
        """``(stage, port)`` this input reads, or None when it reads the request."""
        head, sep, tail = self.source.partition(":")
        return (head, tail) if sep and head != REQUEST else None


@dataclass(frozen=True)
class Emit:
    """One output port of a stage; ``terminal`` ones are returned to the caller.

    ``binding`` (TensorRT Edge-LLM's name of the engine tensor behind the port) is recorded and
    written back, not acted on: edgeomni binds ports by name.
    """

    id: str
    kind: str = DEFAULT_EMIT_KIND
    transport: str = DEFAULT_TRANSPORT
    terminal: bool = False
    binding: str | None = None


@dataclass(frozen=True)
class Stage:
    """One engine of the deployment and how it is wired.

    ``max_batch`` None means the cohort width the engine was built with (TensorRT Edge-LLM
    reads 1). ``stream`` (TensorRT Edge-LLM's stream lane, an integer >= 0 or a name) is
    recorded and written back, not acted on: edgeomni runs each engine on its own stream.
    """

    id: str
    runner: str
    artifact: str
    kind: str
    inputs: tuple[Input, ...] = ()
    emits: tuple[Emit, ...] = ()
    max_batch: int | None = None
    max_seq: int | None = None
    # Read-only (deeply); excluded from the hash because mappings are unhashable.
    config: Mapping[str, Any] = field(default_factory=_empty_config, hash=False)
    stream: int | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "emits", tuple(self.emits))
        object.__setattr__(self, "config", _freeze(self.config))

    def port(self, emit_id: str) -> str:
        """The ``<stage>:<port>`` name other stages and ``terminals`` use."""
        return f"{self.id}:{emit_id}"

    def emit(self, emit_id: str) -> Emit | None:
        return next((e for e in self.emits if e.id == emit_id), None)


@dataclass(frozen=True)
class Graph:
    """A whole graph file. Build it with ``parse``/``load``; check it with ``validate``."""

    schema_version: int
    terminals: tuple[str, ...]
    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "terminals", tuple(self.terminals))
        object.__setattr__(self, "stages", tuple(self.stages))

    @property
    def stage_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.stages)

    def stage(self, stage_id: str) -> Stage:
        """The stage named ``stage_id``; a GraphError (not KeyError) names the known ones."""
        for s in self.stages:
            if s.id == stage_id:
                return s
        known = ", ".join(self.stage_ids) or "none"
        raise GraphError("$.stages", f"no stage {stage_id!r} (stages: {known})")

    def ports(self) -> tuple[str, ...]:
        """Every output port, as ``<stage>:<port>``, in file order."""
        return tuple(s.port(e.id) for s in self.stages for e in s.emits)

    def terminal_ports(self) -> tuple[str, ...]:
        """The ports marked ``terminal: true``, in file order."""
        return tuple(s.port(e.id) for s in self.stages for e in s.emits if e.terminal)


# ---------------------------------------------------------------------------------------------
# Parsing: the key tables below are the single source of truth (schema.json is tested
# against them).


class Keys(NamedTuple):
    """The keys one JSON object of the file accepts, in the order ``dump`` writes them."""

    required: tuple[str, ...]
    optional: tuple[str, ...]

    @property
    def all(self) -> tuple[str, ...]:
        return self.required + self.optional


GRAPH_KEYS = Keys(("schema_version", "terminals", "stages"), ())
STAGE_KEYS = Keys(
    ("id", "runner", "artifact", "kind"),
    ("inputs", "emits", "max_batch", "max_seq", "stream", "config"),
)
INPUT_KEYS = Keys(("name", "from"), ("on_missing",))
EMIT_KEYS = Keys(("id",), ("kind", "transport", "binding", "terminal"))

_SIMPLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if _SIMPLE_KEY.fullmatch(key) else f"{path}[{json.dumps(key)}]"


_JSON_TYPES = (
    (type(None), "null"),
    (bool, "boolean"),  # before int: bool is an int in Python
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    ((list, tuple), "array"),
    (Mapping, "object"),
)


def _json_type(value: Any) -> str:
    return next((n for t, n in _JSON_TYPES if isinstance(value, t)), type(value).__name__)


class _Object(dict):
    """A JSON object that remembers keys given twice (json keeps only the last silently)."""

    duplicates: tuple[str, ...] = ()


def _object_pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        first: dict[str, int] = {}  # a key's first position: a later one repeats it
        obj.duplicates = tuple(k for i, (k, _) in enumerate(pairs) if first.setdefault(k, i) != i)
    return obj


def _check_duplicates(obj: Any, path: str) -> None:
    if isinstance(obj, _Object) and obj.duplicates:
        raise GraphError(_at(path, obj.duplicates[0]), "key given more than once")


def _object(value: Any, path: str, keys: Keys) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise GraphError(path, f"expected an object, got {_json_type(value)}")
    _check_duplicates(value, path)
    for key in value:
        if not isinstance(key, str) or key not in keys.all:
            hint = difflib.get_close_matches(str(key), keys.all, n=1)
            did = f"; did you mean {hint[0]!r}?" if hint else ""
            raise GraphError(
                _at(path, str(key)), f"unknown key (expected {', '.join(keys.all)}){did}"
            )
    for key in keys.required:
        if key not in value:
            raise GraphError(_at(path, key), "required key is missing")
    return value


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise GraphError(path, f"expected a string, got {_json_type(value)}")
    return value


def _non_empty_string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise GraphError(path, f"expected a non-empty string, got {_json_type(value)}")
    if not value:
        raise GraphError(path, "expected a non-empty string, got ''")
    return value


def _known(value: Any, path: str, what: str, known: tuple[str, ...]) -> str:
    """A string from ``known``; anything else names the known ones and the nearest of them."""
    value = _string(value, path)
    if value not in known:
        hint = difflib.get_close_matches(value, known, n=1)
        did = f"; did you mean {hint[0]!r}?" if hint else ""
        raise GraphError(path, f"unknown {what} {value!r} (expected {', '.join(known)}){did}")
    return value


def _stream(obj: Mapping[str, Any], path: str) -> int | str | None:
    if "stream" not in obj:
        return None
    value = obj["stream"]
    path = f"{path}.stream"
    expected = "expected an integer >= 0 or a non-empty string"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise GraphError(path, f"{expected}, got {_json_type(value)}")
    if value == "" or (isinstance(value, int) and value < 0):
        raise GraphError(path, f"{expected}, got {value!r}")
    return value


def _array(value: Any, path: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise GraphError(path, f"expected an array, got {_json_type(value)}")
    return value


def _positive_int(obj: Mapping[str, Any], key: str, path: str) -> int | None:
    if key not in obj:
        return None
    value = obj[key]
    path = f"{path}.{key}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphError(path, f"expected an integer >= 1, got {_json_type(value)}")
    if value < 1:
        raise GraphError(path, f"expected an integer >= 1, got {value}")
    return value


def _config(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise GraphError(path, f"expected an object, got {_json_type(value)}")

    def walk(v: Any, p: str) -> None:
        _check_duplicates(v, p)
        if isinstance(v, Mapping):
            for k, item in v.items():
                walk(item, _at(p, str(k)))
        elif isinstance(v, (list, tuple)):
            for i, item in enumerate(v):
                walk(item, f"{p}[{i}]")

    walk(value, path)
    return value


def _parse_input(obj: Any, path: str) -> Input:
    obj = _object(obj, path, INPUT_KEYS)
    on_missing = _string(obj.get("on_missing", "fail"), f"{path}.on_missing")
    if on_missing not in ON_MISSING:
        raise GraphError(
            f"{path}.on_missing", f"expected one of {', '.join(ON_MISSING)}, got {on_missing!r}"
        )
    return Input(
        name=_string(obj["name"], f"{path}.name"),
        source=_string(obj["from"], f"{path}.from"),
        on_missing=on_missing,
    )


def _parse_emit(obj: Any, path: str) -> Emit:
    obj = _object(obj, path, EMIT_KEYS)
    emit_id = _string(obj["id"], f"{path}.id")
    kind = _known(obj.get("kind", DEFAULT_EMIT_KIND), f"{path}.kind", "kind", EMIT_KINDS)
    transport = _known(
        obj.get("transport", DEFAULT_TRANSPORT), f"{path}.transport", "transport", TRANSPORTS
    )
    binding = _non_empty_string(obj["binding"], f"{path}.binding") if "binding" in obj else None
    terminal = obj.get("terminal", False)
    if not isinstance(terminal, bool):
        raise GraphError(f"{path}.terminal", f"expected a boolean, got {_json_type(terminal)}")
    return Emit(id=emit_id, kind=kind, transport=transport, terminal=terminal, binding=binding)


def _parse_stage(obj: Any, path: str) -> Stage:
    obj = _object(obj, path, STAGE_KEYS)
    fields = {k: _string(obj[k], f"{path}.{k}") for k in STAGE_KEYS.required}
    inputs = _array(obj.get("inputs", []), f"{path}.inputs")
    emits = _array(obj.get("emits", []), f"{path}.emits")
    return Stage(
        **fields,
        inputs=tuple(_parse_input(x, f"{path}.inputs[{i}]") for i, x in enumerate(inputs)),
        emits=tuple(_parse_emit(x, f"{path}.emits[{i}]") for i, x in enumerate(emits)),
        max_batch=_positive_int(obj, "max_batch", path),
        max_seq=_positive_int(obj, "max_seq", path),
        stream=_stream(obj, path),
        config=_config(obj.get("config", {}), f"{path}.config"),
    )


def parse(obj: Any) -> Graph:
    """Build a Graph from decoded JSON, checking its structure; see ``validate`` for meaning."""
    obj = _object(obj, "$", GRAPH_KEYS)
    version = obj["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise GraphError("$.schema_version", f"expected an integer, got {_json_type(version)}")
    terminals = _array(obj["terminals"], "$.terminals")
    stages = _array(obj["stages"], "$.stages")
    return Graph(
        schema_version=version,
        terminals=tuple(_string(t, f"$.terminals[{i}]") for i, t in enumerate(terminals)),
        stages=tuple(_parse_stage(s, f"$.stages[{i}]") for i, s in enumerate(stages)),
    )


def _reject_constant(name: str) -> Any:
    raise GraphError("$", f"{name} is not valid JSON")


def loads(text: str | bytes) -> Graph:
    """Parse the text of a graph file; a JSON syntax error names its line and column."""
    try:
        obj = json.loads(text, object_pairs_hook=_object_pairs, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise GraphError("$", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
    except UnicodeDecodeError as e:
        raise GraphError("$", f"not UTF-8 text: {e}") from e
    return parse(obj)


def graph_file(path: str | os.PathLike[str]) -> Path:
    """The graph file for ``path``: the file itself, or ``multistage_config.json`` in a dir."""
    p = Path(path)
    return p / GRAPH_FILENAME if p.is_dir() else p


def load(path: str | os.PathLike[str]) -> Graph:
    """Read a graph file (or an engine dir holding one); unreadable files are GraphErrors."""
    p = graph_file(path)
    try:
        text = p.read_bytes()
    except OSError as e:
        raise GraphError("$", f"cannot read {p}: {e.strerror or e}") from e
    return loads(text)


def dump(graph: Graph) -> dict[str, Any]:
    """The JSON object of ``graph``; optional keys at their default are left out, as the
    builder writes them (``on_missing``, an emit's ``kind`` and ``transport`` are always
    written, for readers; ``binding`` and ``stream`` only when set)."""
    stages = []
    for s in graph.stages:
        out: dict[str, Any] = {k: getattr(s, k) for k in STAGE_KEYS.required}
        out["inputs"] = [
            {"name": i.name, "from": i.source, "on_missing": i.on_missing} for i in s.inputs
        ]
        out["emits"] = [
            {"id": e.id, "kind": e.kind, "transport": e.transport}
            | ({"binding": e.binding} if e.binding is not None else {})
            | ({"terminal": True} if e.terminal else {})
            for e in s.emits
        ]
        out.update(
            {
                k: getattr(s, k)
                for k in ("max_batch", "max_seq", "stream")
                if getattr(s, k) is not None
            }
        )
        if s.config:
            out["config"] = _thaw(s.config)
        stages.append(out)
    return {
        "schema_version": graph.schema_version,
        "terminals": list(graph.terminals),
        "stages": stages,
    }


def dumps(graph: Graph) -> str:
    """The text of the graph file: indent 2, trailing newline."""
    return json.dumps(dump(graph), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write the graph file atomically, so a reader never sees half a file."""
    target = Path(path)
    text = dumps(graph)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the file is meant to be read by others
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the file, for editors and other tools."""
    return json.loads(Path(__file__).with_name("schema.json").read_text(encoding="utf-8"))
