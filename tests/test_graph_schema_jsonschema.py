"""schema.json (for editors) must say what parse() and validate() accept."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import edgeomni.graph_schema as gs
from edgeomni.graph_schema import Emit, GraphError, Input, json_schema, parse, validate
from edgeomni.graph_schema.model import EMIT_KEYS, GRAPH_KEYS, INPUT_KEYS, STAGE_KEYS, Keys
from edgeomni.graph_schema.validate import FIELD, NAME

SCHEMA = json.loads((Path(gs.__file__).parent / "schema.json").read_text())

MINIMAL_STAGE = {"id": "llm", "runner": "llm.backbone", "artifact": ".", "kind": "autoregressive"}
MINIMAL_INPUT = {"name": "prompt", "from": "request:messages"}
MINIMAL_EMIT = {"id": "text", "kind": "text"}
VALUES: dict[str, Any] = {  # a valid value for every optional key
    "inputs": [MINIMAL_INPUT],
    "emits": [MINIMAL_EMIT],
    "max_batch": 4,
    "max_seq": 2048,
    "stream": 0,
    "config": {"a": 1},
    "on_missing": "skip",
    "kind": "hidden",
    "transport": "device_tensor",
    "binding": "hidden_states",
    "terminal": True,
}


def wrap(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Place one object of ``kind`` in a whole document; return (document)."""
    if kind == "graph":
        return obj
    stage = obj if kind == "stage" else dict(MINIMAL_STAGE)
    if kind == "input":
        stage["inputs"] = [obj]
    if kind == "emit":
        stage["emits"] = [obj]
    return {"schema_version": 1, "terminals": [], "stages": [stage]}


PATHS = {
    "graph": "$",
    "stage": "$.stages[0]",
    "input": "$.stages[0].inputs[0]",
    "emit": "$.stages[0].emits[0]",
}
MINIMAL = {
    "graph": {"schema_version": 1, "terminals": [], "stages": []},
    "stage": MINIMAL_STAGE,
    "input": MINIMAL_INPUT,
    "emit": MINIMAL_EMIT,
}
DEFS = [
    ("graph", SCHEMA, GRAPH_KEYS),
    ("stage", SCHEMA["$defs"]["stage"], STAGE_KEYS),
    ("input", SCHEMA["$defs"]["input"], INPUT_KEYS),
    ("emit", SCHEMA["$defs"]["emit"], EMIT_KEYS),
]


@pytest.mark.parametrize(("kind", "schema", "keys"), DEFS, ids=[d[0] for d in DEFS])
def test_schema_keys_match_parse(kind: str, schema: dict, keys: Keys) -> None:
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == set(keys.required)
    assert set(schema["properties"]) == set(keys.all)


@pytest.mark.parametrize(("kind", "schema", "keys"), DEFS, ids=[d[0] for d in DEFS])
def test_parse_enforces_what_the_schema_says(kind: str, schema: dict, keys: Keys) -> None:
    full = copy.deepcopy(MINIMAL[kind])
    full.update({k: VALUES[k] for k in schema["properties"] if k not in schema["required"]})
    parse(wrap(kind, full))  # every property the schema lists is accepted
    for key in schema["required"]:
        broken = copy.deepcopy(MINIMAL[kind])
        del broken[key]
        with pytest.raises(GraphError) as info:
            parse(wrap(kind, broken))
        assert info.value.path == f"{PATHS[kind]}.{key}"
    extra = dict(copy.deepcopy(MINIMAL[kind]), extra_key=1)
    with pytest.raises(GraphError) as info:
        parse(wrap(kind, extra))
    assert info.value.path == f"{PATHS[kind]}.extra_key"


def test_schema_enums_defaults_and_patterns_match_the_code() -> None:
    props = SCHEMA["$defs"]
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["properties"]["schema_version"]["const"] == gs.SCHEMA_VERSION
    assert set(props["input"]["properties"]["on_missing"]["enum"]) == set(gs.ON_MISSING)
    assert props["input"]["properties"]["on_missing"]["default"] == Input("n", "s").on_missing
    emit = props["emit"]["properties"]
    assert tuple(emit["transport"]["enum"]) == gs.TRANSPORTS
    assert tuple(emit["kind"]["enum"]) == gs.EMIT_KINDS
    assert emit["transport"]["default"] == Emit("i").transport == gs.DEFAULT_TRANSPORT
    assert emit["kind"]["default"] == Emit("i").kind == gs.DEFAULT_EMIT_KIND
    assert emit["terminal"]["default"] is Emit("i").terminal
    assert (emit["binding"]["type"], emit["binding"]["minLength"]) == ("string", 1)
    stream = props["stage"]["properties"]["stream"]["oneOf"]
    assert stream == [{"type": "integer", "minimum": 0}, {"type": "string", "minLength": 1}]
    assert "minLength" not in props["stage"]["properties"]["artifact"]  # "" is the dir itself
    assert props["name"]["pattern"] == f"^{NAME.pattern}$"
    port = f"^{NAME.pattern}:{NAME.pattern}$"
    assert props["port"]["pattern"] == port
    source = props["input"]["properties"]["from"]["pattern"]
    assert source == f"^(request:{FIELD.pattern}|{NAME.pattern}:{NAME.pattern})$"


@pytest.mark.parametrize(
    ("kind", "key", "value", "path"),
    [
        ("emit", "transport", "bogus", "$.stages[0].emits[0].transport"),
        ("emit", "kind", "bogus", "$.stages[0].emits[0].kind"),
        ("emit", "binding", "", "$.stages[0].emits[0].binding"),
        ("stage", "stream", -1, "$.stages[0].stream"),
        ("stage", "stream", "", "$.stages[0].stream"),
    ],
)
def test_the_code_refuses_what_the_schema_refuses(
    kind: str, key: str, value: Any, path: str
) -> None:
    doc = dict(copy.deepcopy(MINIMAL[kind]), **{key: value})
    with pytest.raises(GraphError) as info:
        validate(parse(wrap(kind, doc)))
    assert info.value.path == path


def test_json_schema_returns_the_shipped_file() -> None:
    assert json_schema() == SCHEMA
