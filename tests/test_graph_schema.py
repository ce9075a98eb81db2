"""graph_schema: parse, validate, round-trip and artifact checks of multistage_config.json."""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from edgeomni.graph_schema import (
    Graph,
    GraphError,
    Input,
    Stage,
    dump,
    dumps,
    load,
    loads,
    parse,
    save,
    validate,
    validate_file,
)

# The spec's abridged Qwen3-Omni graph, written exactly as dump() writes it.
OMNI: dict[str, Any] = {
    "schema_version": 1,
    "terminals": ["thinker:text", "code2wav:audio"],
    "stages": [
        {
            "id": "thinker",
            "runner": "llm.backbone",
            "artifact": ".",
            "kind": "autoregressive",
            "inputs": [
                {"name": "prompt", "from": "request:messages", "on_missing": "fail"},
                {"name": "audio", "from": "request:audio", "on_missing": "skip"},
            ],
            "emits": [
                {"id": "text", "kind": "text", "transport": "chunk_stream", "terminal": True},
                {"id": "accept_hidden", "kind": "hidden", "transport": "chunk_stream"},
            ],
        },
        {
            "id": "talker",
            "runner": "qwen3_omni.talker",
            "artifact": "talker",
            "kind": "autoregressive",
            "inputs": [
                {"name": "hidden", "from": "thinker:accept_hidden", "on_missing": "fail"},
                {"name": "text_ids", "from": "thinker:text", "on_missing": "fail"},
                {"name": "voice", "from": "request:voice", "on_missing": "skip"},
            ],
            "emits": [{"id": "codes", "kind": "codec", "transport": "chunk_stream"}],
        },
        {
            "id": "code2wav",
            "runner": "qwen3_omni.code2wav",
            "artifact": "code2wav",
            "kind": "iterative",
            "inputs": [{"name": "codes", "from": "talker:codes", "on_missing": "fail"}],
            "emits": [
                {"id": "audio", "kind": "audio", "transport": "chunk_stream", "terminal": True}
            ],
        },
    ],
}

LLM: dict[str, Any] = {
    "schema_version": 1,
    "terminals": ["llm:text"],
    "stages": [
        {
            "id": "llm",
            "runner": "llm.backbone",
            "artifact": ".",
            "kind": "autoregressive",
            "inputs": [{"name": "prompt", "from": "request:messages"}],
            "emits": [{"id": "text", "kind": "text", "terminal": True}],
        }
    ],
}

# A graph as TensorRT Edge-LLM's multistage_inference writes it: emits with a binding, stages
# with a stream lane, an emit without kind (text), artifact "" (the graph's own dir) and no
# transport anywhere.
UPSTREAM: dict[str, Any] = {
    "schema_version": 1,
    "terminals": ["thinker:text", "code2wav:audio"],
    "stages": [
        {
            "id": "thinker",
            "runner": "llm.backbone",
            "artifact": "",
            "kind": "autoregressive",
            "stream": 0,
            "inputs": [{"name": "prompt", "from": "request:messages"}],
            "emits": [
                {"id": "text", "binding": "output_ids", "terminal": True},
                {"id": "accept_hidden", "kind": "hidden", "binding": "hidden_states"},
            ],
        },
        {
            "id": "talker",
            "runner": "qwen3_omni.talker",
            "artifact": "talker",
            "kind": "autoregressive",
            "stream": "talker_lane",
            "inputs": [{"name": "hidden", "from": "thinker:accept_hidden"}],
            "emits": [{"id": "codes", "kind": "codec"}],
        },
        {
            "id": "code2wav",
            "runner": "qwen3_omni.code2wav",
            "artifact": "code2wav",
            "kind": "iterative",
            "inputs": [{"name": "codes", "from": "talker:codes"}],
            "emits": [{"id": "audio", "kind": "audio", "terminal": True}],
        },
    ],
}

RUNNERS = {
    "llm.backbone": "autoregressive",
    "qwen3_omni.talker": "autoregressive",
    "qwen3_omni.code2wav": "iterative",
}

DEL = object()


def edit(path: str, value: Any) -> Callable[[Any], Any]:
    """A mutation of OMNI: set (or delete, with DEL) the key at a dotted path."""

    def apply(doc: Any) -> Any:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        key: Any = int(last) if isinstance(node, list) else last
        if value is DEL:
            del node[key]
        elif isinstance(node, list) and key == len(node):
            node.append(value)
        else:
            node[key] = value
        return doc

    return apply


def rename(path: str, new: str) -> Callable[[Any], Any]:
    def apply(doc: Any) -> Any:
        *parents, last = path.split(".")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[new] = node.pop(last)
        return doc

    return apply


@pytest.mark.parametrize("doc", [OMNI, LLM], ids=["omni", "llm"])
def test_valid_graphs_are_accepted(doc: dict[str, Any]) -> None:
    graph = parse(copy.deepcopy(doc))
    validate(graph, RUNNERS)
    assert graph.terminals == tuple(doc["terminals"])
    assert graph.stage_ids == tuple(s["id"] for s in doc["stages"])
    assert set(graph.terminal_ports()) == set(doc["terminals"])


def test_parse_fills_defaults() -> None:
    llm = parse(LLM)
    stage = llm.stage("llm")
    assert stage.inputs == (Input("prompt", "request:messages", "fail"),)
    assert stage.emits[0].transport == "chunk_stream"
    assert stage.emits[0].binding is None and stage.stream is None
    assert stage.max_batch is None and dict(stage.config) == {}
    no_kind = copy.deepcopy(LLM)
    del no_kind["stages"][0]["emits"][0]["kind"]
    assert parse(no_kind).stage("llm").emits[0].kind == "text"  # upstream's default
    assert stage.inputs[0].request_field == "messages" and stage.inputs[0].upstream is None
    talker = parse(OMNI).stage("talker")
    assert talker.inputs[0].upstream == ("thinker", "accept_hidden")
    assert talker.inputs[0].request_field is None


def no_terminals(doc: Any) -> Any:
    for i, k in ((0, 0), (2, 0)):
        del doc["stages"][i]["emits"][k]["terminal"]
    doc["terminals"] = []
    return doc


# One row per broken graph: (name, mutation of OMNI, expected JSON path, message fragment).
# fmt: off
BROKEN: list[tuple[str, Callable[[Any], Any], str, str]] = [
    ("top level not an object", lambda d: [d], "$", "expected an object"),
    ("schema_version missing", edit("schema_version", DEL), "$.schema_version", "missing"),
    ("schema_version string", edit("schema_version", "1"), "$.schema_version", "integer"),
    ("schema_version 2", edit("schema_version", 2), "$.schema_version", "unsupported"),
    ("unknown top key", rename("terminals", "terminal"), "$.terminal", "'terminals'"),
    ("terminals not array", edit("terminals", "thinker:text"), "$.terminals", "array"),
    ("terminal not string", edit("terminals.1", 3), "$.terminals[1]", "string"),
    ("terminal not a port", edit("terminals.1", "code2wav"), "$.terminals[1]", "<stage>:<port>"),
    ("stage runner missing", edit("stages.1.runner", DEL), "$.stages[1].runner", "missing"),
    ("stage key typo", rename("stages.2.artifact", "artefact"), "$.stages[2].artefact", "'artifact'"),
    ("stage id wrong type", edit("stages.0.id", 7), "$.stages[0].id", "string"),
    ("inputs not array", edit("stages.0.inputs", {}), "$.stages[0].inputs", "array"),
    ("input from missing", edit("stages.1.inputs.0.from", DEL), "$.stages[1].inputs[0].from", "missing"),
    ("input key typo", rename("stages.1.inputs.0.from", "form"), "$.stages[1].inputs[0].form", "'from'"),
    ("on_missing bad", edit("stages.0.inputs.1.on_missing", "ignore"), "$.stages[0].inputs[1].on_missing", "skip, fail, prune"),
    ("emit id missing", edit("stages.2.emits.0.id", DEL), "$.stages[2].emits[0].id", "missing"),
    ("emit kind empty", edit("stages.2.emits.0.kind", ""), "$.stages[2].emits[0].kind", "unknown kind ''"),
    ("emit terminal not bool", edit("stages.0.emits.0.terminal", "yes"), "$.stages[0].emits[0].terminal", "boolean"),
    ("max_batch zero", edit("stages.0.max_batch", 0), "$.stages[0].max_batch", ">= 1"),
    ("max_seq bool", edit("stages.1.max_seq", True), "$.stages[1].max_seq", ">= 1"),
    ("max_seq null", edit("stages.1.max_seq", None), "$.stages[1].max_seq", "null"),
    ("config not object", edit("stages.2.config", [1]), "$.stages[2].config", "object"),
    ("stage id reserved", edit("stages.0.id", "request"), "$.stages[0].id", "reserved"),
    ("stage id with colon", edit("stages.0.id", "thi:nker"), "$.stages[0].id", "stage id"),
    ("duplicate stage id", edit("stages.2.id", "talker"), "$.stages[2].id", "duplicate stage id"),
    ("empty runner", edit("stages.0.runner", ""), "$.stages[0].runner", "empty"),
    ("duplicate input name", edit("stages.1.inputs.1.name", "hidden"), "$.stages[1].inputs[1].name", "duplicate"),
    ("duplicate emit id", edit("stages.0.emits.1.id", "text"), "$.stages[0].emits[1].id", "duplicate"),
    ("empty emit id", edit("stages.2.emits.0.id", ""), "$.stages[2].emits[0].id", "emit id"),
    ("absolute artifact", edit("stages.1.artifact", "/opt/talker"), "$.stages[1].artifact", "relative"),
    ("parent artifact", edit("stages.2.artifact", "talker/../../x"), "$.stages[2].artifact", "'..'"),
    ("from without colon", edit("stages.1.inputs.0.from", "thinker"), "$.stages[1].inputs[0].from", "expected"),
    ("request field empty", edit("stages.0.inputs.1.from", "request:"), "$.stages[0].inputs[1].from", "expected"),
    ("request field bad", edit("stages.0.inputs.1.from", "request:2x"), "$.stages[0].inputs[1].from", "identifier"),
    ("from unknown stage", edit("stages.1.inputs.1.from", "thinkr:text"), "$.stages[1].inputs[1].from", "unknown stage 'thinkr'"),
    ("from unknown port", edit("stages.1.inputs.0.from", "thinker:hidden"), "$.stages[1].inputs[0].from", "no emit 'hidden'"),
    ("self reference", edit("stages.1.inputs.2.from", "talker:codes"), "$.stages[1].inputs[2].from", "own output"),
    ("cycle", edit("stages.0.inputs.2", {"name": "fb", "from": "code2wav:audio"}), "$.stages[1].inputs[0].from", "cycle: talker -> code2wav -> thinker -> talker"),
    ("no terminals", no_terminals, "$.terminals", "at least one"),
    ("terminal not listed", edit("terminals", ["thinker:text"]), "$.stages[2].emits[0].terminal", "'code2wav:audio'"),
    ("terminal not marked", edit("terminals.2", "talker:codes"), "$.terminals[2]", "not marked"),
    ("terminal unknown port", edit("terminals.1", "code2wav:wave"), "$.terminals[1]", "not an output port"),
    ("terminal duplicate", edit("terminals.1", "thinker:text"), "$.terminals[1]", "duplicate terminal"),
]
# fmt: on


@pytest.mark.parametrize(
    ("mutate", "path", "fragment"),
    [pytest.param(m, p, f, id=name) for name, m, p, f in BROKEN],
)
def test_broken_graph_is_rejected_at_its_path(mutate: Callable, path: str, fragment: str) -> None:
    doc = mutate(copy.deepcopy(OMNI))
    with pytest.raises(GraphError) as info:
        validate(parse(doc))
    assert info.value.path == path, str(info.value)
    assert fragment in info.value.message
    assert str(info.value) == f"{path}: {info.value.message}"


# TensorRT Edge-LLM's keys with values nobody can mean: (name, mutation, path, whole message).
# fmt: off
UPSTREAM_BROKEN: list[tuple[str, Callable[[Any], Any], str, str]] = [
    ("binding integer", edit("stages.0.emits.1.binding", 3), "$.stages[0].emits[1].binding", "expected a non-empty string, got integer"),
    ("binding empty", edit("stages.0.emits.0.binding", ""), "$.stages[0].emits[0].binding", "expected a non-empty string, got ''"),
    ("binding null", edit("stages.0.emits.0.binding", None), "$.stages[0].emits[0].binding", "expected a non-empty string, got null"),
    ("stream negative", edit("stages.0.stream", -1), "$.stages[0].stream", "expected an integer >= 0 or a non-empty string, got -1"),
    ("stream boolean", edit("stages.1.stream", True), "$.stages[1].stream", "expected an integer >= 0 or a non-empty string, got boolean"),
    ("stream empty", edit("stages.1.stream", ""), "$.stages[1].stream", "expected an integer >= 0 or a non-empty string, got ''"),
    ("stream number", edit("stages.2.stream", 1.5), "$.stages[2].stream", "expected an integer >= 0 or a non-empty string, got number"),
    ("transport bogus", edit("stages.0.emits.1.transport", "bogus"), "$.stages[0].emits[1].transport", "unknown transport 'bogus' (expected chunk_stream, device_tensor)"),
    ("transport typo", edit("stages.2.emits.0.transport", "device_tensors"), "$.stages[2].emits[0].transport", "unknown transport 'device_tensors' (expected chunk_stream, device_tensor); did you mean 'device_tensor'?"),
    ("transport empty", edit("stages.1.emits.0.transport", ""), "$.stages[1].emits[0].transport", "unknown transport '' (expected chunk_stream, device_tensor)"),
    ("transport integer", edit("stages.1.emits.0.transport", 1), "$.stages[1].emits[0].transport", "expected a string, got integer"),
    ("kind bogus", edit("stages.0.emits.1.kind", "bogus"), "$.stages[0].emits[1].kind", "unknown kind 'bogus' (expected text, hidden, codec, audio, image, video)"),
    ("kind typo", edit("stages.2.emits.0.kind", "audios"), "$.stages[2].emits[0].kind", "unknown kind 'audios' (expected text, hidden, codec, audio, image, video); did you mean 'audio'?"),
    ("kind null", edit("stages.1.emits.0.kind", None), "$.stages[1].emits[0].kind", "expected a string, got null"),
]
# fmt: on


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [pytest.param(m, p, msg, id=name) for name, m, p, msg in UPSTREAM_BROKEN],
)
def test_upstream_keys_with_bad_values_are_rejected(
    mutate: Callable, path: str, message: str
) -> None:
    doc = mutate(copy.deepcopy(UPSTREAM))
    with pytest.raises(GraphError) as info:
        parse(doc)
    assert (info.value.path, info.value.message) == (path, message)
    assert str(info.value) == f"{path}: {message}"


def test_upstream_graph_parses_validates_and_round_trips(tmp_path) -> None:
    eng = _engine(tmp_path, UPSTREAM)
    graph = validate_file(eng, RUNNERS)
    assert graph == parse(UPSTREAM)
    thinker, talker, code2wav = graph.stages
    assert thinker.artifact == "" and thinker.stream == 0 and talker.stream == "talker_lane"
    assert code2wav.stream is None
    assert [(e.id, e.kind, e.binding) for e in thinker.emits] == [
        ("text", "text", "output_ids"),
        ("accept_hidden", "hidden", "hidden_states"),
    ]
    assert {e.transport for s in graph.stages for e in s.emits} == {"chunk_stream"}
    assert all(s.max_batch is None for s in graph.stages)  # the engine's own width applies
    assert parse(dump(graph)) == graph
    assert loads(dumps(graph)) == graph
    written = dump(graph)
    assert written["stages"][0]["artifact"] == ""  # kept as written
    assert written["stages"][0]["stream"] == 0 and written["stages"][1]["stream"] == "talker_lane"
    assert "stream" not in written["stages"][2]
    assert written["stages"][0]["emits"] == [  # kind and transport written, binding kept
        {
            "id": "text",
            "kind": "text",
            "transport": "chunk_stream",
            "binding": "output_ids",
            "terminal": True,
        },
        {
            "id": "accept_hidden",
            "kind": "hidden",
            "transport": "chunk_stream",
            "binding": "hidden_states",
        },
    ]
    assert "binding" not in written["stages"][1]["emits"][0]
    save(graph, eng / "multistage_config.json")
    assert validate_file(eng, RUNNERS) == graph


def test_device_tensor_transport_is_accepted_and_kept() -> None:
    doc = copy.deepcopy(UPSTREAM)
    doc["stages"][1]["emits"][0]["transport"] = "device_tensor"
    graph = parse(doc)
    assert graph.stage("talker").emits[0].transport == "device_tensor"
    assert dump(graph)["stages"][1]["emits"][0]["transport"] == "device_tensor"


@pytest.mark.parametrize("artifact", ["", "."])
def test_empty_artifact_is_the_engine_dir_itself(tmp_path, artifact: str) -> None:
    doc = copy.deepcopy(LLM)
    doc["stages"][0]["artifact"] = artifact
    graph = parse(doc)
    validate(graph, RUNNERS, engine_dir=tmp_path)  # tmp_path holds no subfolder: it is the dir
    assert tmp_path / graph.stage("llm").artifact == tmp_path  # the runtime's join
    assert dump(graph)["stages"][0]["artifact"] == artifact
    # Still refused when the engine dir itself is missing, naming the artifact as written.
    with pytest.raises(GraphError) as info:
        validate(graph, RUNNERS, engine_dir=tmp_path / "gone")
    assert info.value.path == "$.stages[0].artifact"
    assert info.value.message.startswith(f"artifact {artifact!r} does not exist")


@pytest.mark.parametrize(
    ("mutate", "path", "fragment"),
    [
        (edit("stages.1.runner", "qwen3_omni.talkr"), "$.stages[1].runner", "known: llm.backbone"),
        (edit("stages.2.kind", "autoregressive"), "$.stages[2].kind", "'iterative'"),
    ],
    ids=["unknown runner", "kind mismatch"],
)
def test_runner_table_is_enforced(mutate: Callable, path: str, fragment: str) -> None:
    graph = parse(mutate(copy.deepcopy(OMNI)))
    validate(graph)  # structurally fine without a runner table
    with pytest.raises(GraphError) as info:
        validate(graph, RUNNERS)
    assert info.value.path == path
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ('{"schema_version": 1,, }', "$", "line 1 column 22"),
        ('{\n  "schema_version": 1,\n  "terminals": [\n}', "$", "line 4 column 1"),
        ('{"schema_version": NaN, "terminals": [], "stages": []}', "$", "NaN"),
        (
            '{"schema_version": 1, "schema_version": 1, "terminals": [], "stages": []}',
            "$.schema_version",
            "more than once",
        ),
        (
            '{"schema_version": 1, "terminals": [], "stages": [{"id": "a", "runner": "r", '
            '"artifact": ".", "kind": "k", "config": {"x": {"y": 1, "y": 2}}}]}',
            "$.stages[0].config.x.y",
            "more than once",
        ),
    ],
    ids=["syntax", "unclosed", "nan", "duplicate key", "duplicate config key"],
)
def test_loads_errors_carry_a_path(text: str, path: str, fragment: str) -> None:
    with pytest.raises(GraphError) as info:
        loads(text)
    assert info.value.path == path
    assert fragment in info.value.message


def test_load_missing_file_is_a_graph_error(tmp_path) -> None:
    with pytest.raises(GraphError) as info:
        load(tmp_path / "nope.json")
    assert info.value.path == "$" and "nope.json" in info.value.message


@pytest.mark.parametrize("doc", [OMNI, LLM], ids=["omni", "llm"])
def test_round_trip(doc: dict[str, Any], tmp_path) -> None:
    graph = parse(doc)
    assert parse(dump(graph)) == graph
    assert loads(dumps(graph)) == graph
    text = dumps(graph)
    assert text.endswith("}\n") and text.startswith('{\n  "schema_version": 1,')
    save(graph, tmp_path / "multistage_config.json")
    assert load(tmp_path / "multistage_config.json") == graph
    assert load(tmp_path) == graph  # an engine dir finds multistage_config.json
    assert os.listdir(tmp_path) == ["multistage_config.json"]  # no temp file left behind


def test_dump_of_spec_example_is_identical() -> None:
    assert dump(parse(OMNI)) == OMNI
    assert dump(parse(LLM))["stages"][0]["inputs"][0]["on_missing"] == "fail"


def test_round_trip_keeps_limits_and_config(tmp_path) -> None:
    doc = copy.deepcopy(OMNI)
    doc["stages"][1].update(max_batch=4, max_seq=4096, config={"codebooks": [16, {"a": None}]})
    graph = parse(doc)
    assert dump(graph) == doc
    path = tmp_path / "g.json"
    path.write_text("stale")
    save(graph, path)  # replaces an existing file
    again = load(path)
    assert again == graph and again.stage("talker").max_batch == 4
    assert again.stage("talker").config["codebooks"] == (16, {"a": None})
    with pytest.raises(TypeError):
        again.stage("talker").config["codebooks"] = 1  # type: ignore[index]


def test_save_failure_leaves_target_and_no_temp(tmp_path) -> None:
    path = tmp_path / "g.json"
    path.write_text("old")
    bad = Graph(1, ("a:x",), (Stage("a", "r", ".", "k", config={"nan": float("nan")}),))
    with pytest.raises(ValueError):
        save(bad, path)
    assert path.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["g.json"]


def test_graph_helpers() -> None:
    graph = parse(OMNI)
    assert graph.stage("talker").runner == "qwen3_omni.talker"
    assert graph.ports() == (
        "thinker:text",
        "thinker:accept_hidden",
        "talker:codes",
        "code2wav:audio",
    )
    with pytest.raises(GraphError) as info:
        graph.stage("vocoder")
    assert "thinker, talker, code2wav" in info.value.message
    err = pickle.loads(pickle.dumps(GraphError("$.x", "bad")))
    assert (err.path, err.message, str(err)) == ("$.x", "bad", "$.x: bad")
    assert isinstance(err, ValueError)


def _engine(tmp_path, doc: dict[str, Any] = OMNI):
    eng = tmp_path / "eng"
    for sub in ("talker", "code2wav"):
        (eng / sub).mkdir(parents=True)
    (eng / "multistage_config.json").write_text(json.dumps(doc))
    return eng


def test_validate_file_checks_artifacts_exist(tmp_path) -> None:
    eng = _engine(tmp_path)
    graph = validate_file(eng / "multistage_config.json", RUNNERS)
    assert graph == parse(OMNI)
    assert validate_file(eng) == graph
    os.rmdir(eng / "code2wav")
    with pytest.raises(GraphError) as info:
        validate_file(eng)
    assert info.value.path == "$.stages[2].artifact" and "does not exist" in info.value.message
    (eng / "code2wav").write_text("not a dir")
    with pytest.raises(GraphError) as info:
        validate_file(eng)
    assert info.value.path == "$.stages[2].artifact" and "not a directory" in info.value.message


def test_symlinked_artifact_escaping_engine_dir_is_rejected(tmp_path) -> None:
    eng = _engine(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.rmdir(eng / "talker")
    os.symlink(outside, eng / "talker")
    with pytest.raises(GraphError) as info:
        validate_file(eng)
    assert info.value.path == "$.stages[1].artifact"
    assert "outside" in info.value.message


def test_symlinked_artifact_inside_engine_dir_is_accepted(tmp_path) -> None:
    eng = _engine(tmp_path)
    (eng / "engines" / "talker_v2").mkdir(parents=True)
    os.rmdir(eng / "talker")
    os.symlink(eng / "engines" / "talker_v2", eng / "talker")
    assert validate_file(eng).stage("talker").artifact == "talker"
    # The engine dir itself may be reached through a symlink too.
    link = tmp_path / "link"
    os.symlink(eng, link)
    assert validate_file(link).stage_ids == ("thinker", "talker", "code2wav")
