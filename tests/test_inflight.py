"""In-flight batching (runtime/scheduler.run_graph over the one decoder stage,
runtime/decoder_stage.py): requests join a running batch as rows free up and leave it the step they finish; each row has its own
sampling settings and generator, so a request's output is what it gives alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgeomni.runtime import cli
from edgeomni.runtime.events import Failed, Finished, TextDelta
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file

PROMPTS = [
    "Hello! How are you today?",
    "What is the capital of France?",
    "Hi",
    "The quick brown fox jumps over the lazy dog. Speech models turn text into audio.",
    "Count to ten.",
    "Why is the sky blue? Answer in one sentence please.",
]
LENGTHS = [3, 17, 6, 11, 2, 9]  # different output lengths: rows free up at different steps


def body(sampling: dict | None = None, **extra: Any) -> dict:
    return {
        "top_k": 1,
        **(sampling or {}),
        "requests": [
            {"messages": [{"role": "user", "content": p}], "max_generate_length": n}
            for p, n in zip(PROMPTS, LENGTHS, strict=True)
        ],
        **extra,
    }


def run(engine: Path, obj: dict, batch_size: int, batching: str = "inflight", listener=None):
    requests, _ = parse_request_file(obj)
    pipe = Pipeline(engine, batching=batching)
    return pipe.run(requests, batch_size=batch_size, listener=listener)


def tokens(outcomes: list, stage: str = "llm") -> list[list[int]]:
    return [o.entry["stages"][stage]["output_tokens"] for o in outcomes]


def alone(engine: Path, obj: dict, stage: str = "llm") -> list[list[int]]:
    """Each request of ``obj`` run by itself."""
    out = []
    for req in obj["requests"]:
        one = {**obj, "requests": [req]}
        out += tokens(run(engine, one, 1), stage)
    return out


def test_greedy_inflight_equals_each_request_alone(qwen3_engine: Path, monkeypatch) -> None:
    from edgeomni.runtime.decoder_stage import DecoderStage

    moves: list[tuple[int, int]] = []
    real_move = DecoderStage.move

    def move(self, slot, row):  # noqa: ANN001, ANN202
        moves.append((slot.row, row))
        real_move(self, slot, row)

    monkeypatch.setattr(DecoderStage, "move", move)
    events: list[Any] = []
    got = run(qwen3_engine, body(), batch_size=3, listener=events.append)
    assert moves, "the draining batch moved no row down"  # its cache moved with it
    assert all(o.entry["ok"] for o in got), [o.entry["error"] for o in got]
    assert tokens(got) == alone(qwen3_engine, body())
    assert tokens(got) == tokens(run(qwen3_engine, body(), 3, "cohort"))
    # rows were reused: a request was admitted while another still decoded
    first = {}
    finished = {}
    for n, e in enumerate(events):
        if isinstance(e, TextDelta):
            first.setdefault(e.index, n)
        if isinstance(e, Finished):
            finished[e.index] = n
    assert any(first[j] < finished[i] and first[i] < first[j]
               for i in first for j in first if i != j and j > 1)  # fmt: skip
    assert max(o.entry["stages"]["llm"]["cohort_size"] for o in got) == 3
    assert {o.entry["batch_idx"] for o in got} == {0, 1, 2}


def test_omni_thinker_text_inflight_equals_alone(omni_engine: Path) -> None:
    obj = body()
    obj["requests"] = obj["requests"][:4]
    got = run(omni_engine, obj, batch_size=3)
    assert all(o.entry["ok"] for o in got)
    assert tokens(got, "thinker") == alone(omni_engine, obj, "thinker")


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_a_seeded_request_draws_the_same_alone_and_beside_others(
    qwen3_engine: Path, batching: str
) -> None:
    sampled = {"temperature": 0.9, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.2}
    obj = body(sampled, sampling_seed=5)
    if batching == "inflight":  # neighbours with their own seeds and settings
        obj["requests"][1]["sampling"] = {"seed": 99, "temperature": 0.5}
        obj["requests"][2]["sampling"] = {"top_k": 1}
    got = tokens(run(qwen3_engine, obj, batch_size=3, batching=batching))
    for i in (0, 3, 5):
        one = {**obj, "requests": [obj["requests"][i]]}
        assert got[i] == tokens(run(qwen3_engine, one, 1, batching))[0], i


def test_a_request_failing_mid_run_leaves_alone(qwen3_engine: Path, monkeypatch) -> None:
    from edgeomni.runtime.runners.llm import LLMBackbone

    want = alone(qwen3_engine, body())
    real = LLMBackbone.finished

    def finished(self, slot):  # noqa: ANN001, ANN202
        if slot.state.request.index == 1 and len(slot.generated) == 3:
            raise RuntimeError("boom")
        return real(self, slot)

    monkeypatch.setattr(LLMBackbone, "finished", finished)
    events: list[Any] = []
    got = run(qwen3_engine, body(), batch_size=3, listener=events.append)
    assert [o.entry["ok"] for o in got] == [True, False, True, True, True, True], [
        o.entry["error"] for o in got
    ]
    assert got[1].entry["error"] == "llm: RuntimeError: boom"
    assert got[1].entry["finish_reason"] == "error"
    ok = [i for i in range(6) if i != 1]
    assert tokens([got[i] for i in ok]) == [want[i] for i in ok]
    assert [e for e in events if isinstance(e, Failed)] == [
        Failed(1, "llm", "llm: RuntimeError: boom")
    ]


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_events_arrive_in_order_and_make_the_outputs(qwen3_engine: Path, batching: str) -> None:
    obj = body()
    alone_text = run(qwen3_engine, obj, 1)
    stop = alone_text[1].entry["output_text"][4:7]  # a stop string inside a reply
    assert stop
    obj["requests"][1]["stop"] = [stop]
    events: list[Any] = []
    got = run(qwen3_engine, obj, batch_size=2, batching=batching, listener=events.append)
    for i, outcome in enumerate(got):
        mine = [e for e in events if e.index == i]
        assert isinstance(mine[-1], Finished) and mine[-1].stage == "llm"
        assert not any(isinstance(e, Finished) for e in mine[:-1])
        deltas = [e for e in mine if isinstance(e, TextDelta)]
        assert "".join(d.text for d in deltas) == outcome.entry["output_text"]
        ids = [t for d in deltas for t in d.token_ids]
        assert ids == outcome.entry["stages"]["llm"]["output_tokens"][: len(ids)]
        assert mine[-1].reason == outcome.entry["stages"]["llm"]["finish_reason"]
    assert got[1].entry["finish_reason"] == "stop-words"
    assert stop not in got[1].entry["output_text"]


def test_prompt_streams_the_reply_to_stdout(qwen3_engine: Path, tmp_path: Path, capsys) -> None:
    pred = tmp_path / "p.json"
    code = cli.main(
        [
            "--config",
            str(qwen3_engine),
            "--prompt",
            PROMPTS[1],
            "--sampling",
            '{"top_k": 1}',
            "--max-generate-length",
            "12",
            "--output-file",
            str(pred),
        ]
    )
    assert code == cli.EXIT_OK
    entry = json.loads(pred.read_text())["responses"][0]
    out, err = capsys.readouterr()
    assert out == entry["output_text"] + "\n"
    assert err == ""  # a streamed reply that succeeded: nothing more to say
    assert entry["stages"]["llm"]["batching"] == "inflight"


def test_batching_flag(qwen3_engine: Path, tmp_path: Path, capsys) -> None:
    req = tmp_path / "r.json"
    req.write_text(json.dumps(body()))
    outs = {}
    for mode in ("inflight", "cohort"):
        pred = tmp_path / f"{mode}.json"
        code = cli.main(
            [
                "--config",
                str(qwen3_engine),
                "--input-file",
                str(req),
                "--output-file",
                str(pred),
                "--batch-size",
                "2",
                "--batching",
                mode,
            ]
        )
        assert code == cli.EXIT_OK
        outs[mode] = json.loads(pred.read_text())["responses"]
    assert [e["stages"]["llm"]["output_tokens"] for e in outs["inflight"]] == [
        e["stages"]["llm"]["output_tokens"] for e in outs["cohort"]
    ]
    assert all(e["stages"]["llm"]["batching"] == "cohort" for e in outs["cohort"])
    with pytest.raises(SystemExit):
        cli.main(["--config", str(qwen3_engine), "--prompt", "x", "--batching", "paged"])
    assert "invalid choice: 'paged'" in capsys.readouterr().err


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_seeded_speech_draws_the_same_alone_and_beside_others(
    omni_engine: Path, batching: str
) -> None:
    """The talker's and code predictor's draws come from each request's own generator: a
    request's codes (all 16 groups) are what it gives alone, beside two others, and its audio
    too, to float rounding (the vocoder's calls take the chunks that are ready together, so a
    row is computed in a batch of another size)."""
    import numpy as np

    obj = {
        "top_k": 1, "max_generate_length": 5,
        "talker_temperature": 0.9, "talker_top_k": 20, "talker_seed": 7,
        "talker_max_new_tokens": 10, "cp_temperature": 0.9, "cp_top_k": 20,
        "requests": [{"messages": [{"role": "user", "content": p}], "voice": "ethan"}
                     for p in PROMPTS[:3]],
    }  # fmt: skip
    beside = run(omni_engine, obj, batch_size=3, batching=batching)
    assert beside[0].entry["stages"]["talker"]["cohort_size"] == 3
    for i in range(3):
        (one,) = run(omni_engine, {**obj, "requests": [obj["requests"][i]]}, 1, batching)
        np.testing.assert_array_equal(beside[i].codes, one.codes)
        assert beside[i].audio.shape == one.audio.shape
        assert np.abs(beside[i].audio - one.audio).max() < 1e-5


def test_stage_patience_flag(qwen3_engine: Path, capsys) -> None:
    code = cli.main(["--config", str(qwen3_engine), "--prompt", "x", "--stage-patience", "-1"])
    assert code == cli.EXIT_BAD_CONFIG
    assert "--stage-patience must be at least 0, got -1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="patience must be >= 0"):
        Pipeline(qwen3_engine, patience=-1)
