"""graph_schema.plan: which stages one request runs, and why a request cannot run."""

from __future__ import annotations

from typing import Any

import pytest

from edgeomni.graph_schema import Graph, GraphError, parse, plan, topological_order


def stage(sid: str, inputs: list[tuple[str, str, str]], emits: list[tuple[str, bool]]) -> dict:
    """A stage object: inputs as (name, from, on_missing), emits as (id, terminal)."""
    return {
        "id": sid,
        "runner": f"test.{sid}",
        "artifact": sid,
        "kind": "autoregressive",
        "inputs": [{"name": n, "from": f, "on_missing": m} for n, f, m in inputs],
        "emits": [{"id": e, "kind": "text", "terminal": t} for e, t in emits],
    }


def graph(*stages: dict) -> Graph:
    terminals = [f"{s['id']}:{e['id']}" for s in stages for e in s["emits"] if e["terminal"]]
    doc: dict[str, Any] = {"schema_version": 1, "terminals": terminals, "stages": list(stages)}
    return parse(doc)


THINKER = stage(
    "thinker",
    [("prompt", "request:messages", "fail"), ("audio", "request:audio", "skip")],
    [("text", True), ("accept_hidden", False)],
)
TALKER = stage(
    "talker",
    [
        ("hidden", "thinker:accept_hidden", "fail"),
        ("text_ids", "thinker:text", "fail"),
        ("voice", "request:voice", "skip"),
    ],
    [("codes", False)],
)
CODE2WAV = stage("code2wav", [("codes", "talker:codes", "fail")], [("audio", True)])
OMNI = graph(THINKER, TALKER, CODE2WAV)
LLM = graph(stage("llm", [("prompt", "request:messages", "fail")], [("text", True)]))


@pytest.mark.parametrize(
    ("g", "supplied", "requested", "stages", "terminals", "skipped"),
    [
        pytest.param(
            OMNI,
            {"messages"},
            {"thinker:text"},
            ("thinker",),
            ("thinker:text",),
            {"thinker": ("audio",)},
            id="omni text only",
        ),
        pytest.param(
            OMNI,
            {"messages", "audio"},
            ["thinker:text"],
            ("thinker",),
            ("thinker:text",),
            {},
            id="omni text only with audio",
        ),
        pytest.param(
            OMNI,
            {"messages"},
            None,
            ("thinker", "talker", "code2wav"),
            ("thinker:text", "code2wav:audio"),
            {"thinker": ("audio",), "talker": ("voice",)},
            id="omni full request",
        ),
        pytest.param(
            OMNI,
            {"messages", "audio", "voice"},
            {"code2wav:audio"},
            ("thinker", "talker", "code2wav"),
            ("code2wav:audio",),
            {},
            id="omni audio only",
        ),
        pytest.param(
            LLM,
            {"messages"},
            None,
            ("llm",),
            ("llm:text",),
            {},
            id="one-stage llm",
        ),
    ],
)
def test_plan_runs_the_needed_stages(g, supplied, requested, stages, terminals, skipped) -> None:
    p = plan(g, supplied, requested)
    assert p.ok and p.error is None
    assert p.stages == stages
    assert p.terminals == terminals
    assert dict(p.skipped_inputs) == skipped
    assert p.pruned_terminals == ()


@pytest.mark.parametrize(
    ("requested", "fragments"),
    [
        (
            {"thinker:text"},
            ["terminal thinker:text", "stage thinker", "'prompt'", "request:messages"],
        ),
        (
            {"code2wav:audio"},
            [
                "terminal code2wav:audio needs stage code2wav",
                "'codes'",
                "(talker:codes)",
                "stage talker does not run",
                "'hidden' has no source (thinker:accept_hidden)",
                "stage thinker does not run",
                "does not supply 'messages'",
            ],
        ),
    ],
    ids=["text", "audio"],
)
def test_required_input_missing_fails_the_request(requested, fragments) -> None:
    p = plan(OMNI, {"audio"}, requested)
    assert not p.ok
    assert p.stages == () and p.terminals == ()
    for fragment in fragments:
        assert fragment in p.error


def test_skip_input_from_a_stage_that_cannot_run() -> None:
    # enc is listed after thinker but feeds it, so the order must come from the edges.
    thinker = stage(
        "thinker",
        [("prompt", "request:messages", "fail"), ("feat", "enc:feat", "skip")],
        [("text", True)],
    )
    enc = stage("enc", [("audio", "request:audio", "fail")], [("feat", False)])
    g = graph(thinker, enc)
    without = plan(g, {"messages"})
    assert without.stages == ("thinker",)
    assert dict(without.skipped_inputs) == {"thinker": ("feat",)}
    with_audio = plan(g, {"messages", "audio"})
    assert with_audio.stages == ("enc", "thinker")
    assert dict(with_audio.skipped_inputs) == {}


IMAGE = stage("image", [("prompt", "request:image_prompt", "prune")], [("frames", True)])
PRUNED = graph(THINKER, IMAGE)


def test_prune_drops_the_terminal_and_keeps_the_request() -> None:
    p = plan(PRUNED, {"messages"})
    assert p.ok
    assert p.stages == ("thinker",)
    assert p.terminals == ("thinker:text",)
    assert p.pruned_terminals == ("image:frames",)
    both = plan(PRUNED, {"messages", "image_prompt"})
    assert both.stages == ("thinker", "image") and both.pruned_terminals == ()


def test_prune_of_every_requested_terminal_is_an_error() -> None:
    p = plan(PRUNED, {"messages"}, {"image:frames"})
    assert not p.ok and p.stages == ()
    assert p.pruned_terminals == ("image:frames",)
    assert "every requested terminal was pruned" in p.error
    assert "image_prompt" in p.error


@pytest.mark.parametrize(
    ("near", "far", "ok"),
    [("prune", "prune", True), ("prune", "fail", False), ("fail", "prune", False)],
    ids=["prune-prune", "prune-then-fail", "fail-then-prune"],
)
def test_a_fail_anywhere_on_the_blocking_chain_fails(near: str, far: str, ok: bool) -> None:
    src = stage("src", [("x", "request:x", far)], [("out", False)])
    sink = stage("sink", [("y", "src:out", near)], [("frames", True)])
    g = graph(THINKER, src, sink)
    p = plan(g, {"messages"})
    assert p.ok is ok
    if ok:
        assert p.pruned_terminals == ("sink:frames",) and p.stages == ("thinker",)
    else:
        assert "terminal sink:frames" in p.error and "request does not supply 'x'" in p.error


def test_fail_blocker_wins_over_prune_blocker_on_the_same_stage() -> None:
    both = stage(
        "both",
        [("a", "request:a", "prune"), ("b", "request:b", "fail")],
        [("out", True)],
    )
    p = plan(graph(THINKER, both), {"messages"})
    assert not p.ok and "'b'" in p.error and "request:b" in p.error
    assert plan(graph(THINKER, both), {"messages", "b"}).pruned_terminals == ("both:out",)


def test_unknown_requested_terminal_is_a_graph_error() -> None:
    with pytest.raises(GraphError) as info:
        plan(OMNI, {"messages"}, {"talker:codes"})
    assert info.value.path == "$.terminals"
    assert "'talker:codes'" in info.value.message


def test_empty_request_and_string_arguments() -> None:
    assert plan(OMNI, {"messages"}, set()).error == "no terminal requested"
    with pytest.raises(TypeError):
        plan(OMNI, "messages")
    with pytest.raises(TypeError):
        plan(OMNI, {"messages"}, "thinker:text")


def test_plan_validates_the_graph() -> None:
    bad = graph(stage("a", [("x", "b:y", "fail")], [("out", True)]))
    with pytest.raises(GraphError) as info:
        plan(bad, set())
    assert info.value.path == "$.stages[0].inputs[0].from"


def test_topological_order_keeps_file_order_on_ties() -> None:
    g = graph(CODE2WAV, stage("other", [], [("o", True)]), TALKER, THINKER)
    assert topological_order(g) == ("other", "thinker", "talker", "code2wav")
    assert plan(g, {"messages"}).stages == ("other", "thinker", "talker", "code2wav")
    assert topological_order(g, only={"code2wav", "other"}) == ("code2wav", "other")


def test_stage_feeding_nothing_requested_does_not_run() -> None:
    extra = stage("probe", [("h", "thinker:accept_hidden", "fail")], [("stats", False)])
    g = graph(THINKER, extra)
    assert plan(g, {"messages"}).stages == ("thinker",)
