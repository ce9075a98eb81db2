"""Engines that reduce their logits in the graph (--logits-topk, the GPU default) sample the same
tokens and codes as engines that hand the host the whole vocabulary: greedy and seeded sampling,
with the rows the top-K cannot decide fetched in full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from export_store import ExportStore

from edgeomni.runtime import cli
from edgeomni.runtime.engine import OrtEngine

PROMPTS = ["Hello! How are you today?", "Hi", "What is the capital of France?"]


@pytest.fixture(scope="module")
def topk_engine(qwen3_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    eng = tmp_path_factory.mktemp("topk") / "eng"
    assert build(qwen3_ckpt, eng, BuildArgs(3, 64, 128, logits_topk=8)) is not None
    return eng


def run(engine: Path, tmp: Path, body: dict) -> list[dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "r.json").write_text(json.dumps(body))
    code = cli.main(["--config", str(engine), "--input-file", str(tmp / "r.json"),
                     "--output-file", str(tmp / "p.json"), "--batch-size", "3"])  # fmt: skip
    assert code == cli.EXIT_OK
    return json.loads((tmp / "p.json").read_text())["responses"]


def test_engine_outputs_its_top_k(topk_engine: Path) -> None:
    engine = OrtEngine(topk_engine / "llm.onnx")
    assert engine.output_names[:3] == ("logits", "topk_values", "topk_indices")
    assert engine.output_shapes["topk_values"][-1] == 8


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0},
        {"temperature": 0.8, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3, "seed": 7},
        {"temperature": 1.0, "top_k": 20, "seed": 3},  # k > K: every row from the full logits
    ],
    ids=["greedy", "sampled", "k-above-K"],
)
def test_same_tokens_as_full_logits(topk_engine, qwen3_engine, tmp_path, sampling) -> None:
    body = {**sampling, "max_generate_length": 12,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}  # fmt: skip
    ours = run(topk_engine, tmp_path / "topk", body)
    full = run(qwen3_engine, tmp_path / "full", body)
    for a, b in zip(ours, full, strict=True):
        assert a["stages"]["llm"]["output_tokens"] == b["stages"]["llm"]["output_tokens"]
    llm = ours[0]["stages"]["llm"]
    assert 0 < llm["decode_engine_ms"] <= llm["decode_ms"]
    assert 0 < llm["prefill_engine_ms"] <= llm["prefill_ms"]
    fetched = sum(e["stages"]["llm"]["full_logit_rows"] for e in ours) // len(ours)
    steps = ours[0]["stages"]["llm"]["decode_steps"] + 1  # the prefill's logits too
    if sampling.get("top_k") == 20:
        assert fetched == 3 * steps  # every row of every step
    else:
        assert fetched < steps  # most steps decided by the top-K alone


def test_min_generate_length_holds_back_eos(qwen3_engine, tmp_path) -> None:
    body = {"temperature": 0, "max_generate_length": 40, "min_generate_length": 40,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}  # fmt: skip
    for entry in run(qwen3_engine, tmp_path, body):
        llm = entry["stages"]["llm"]
        assert llm["generated_tokens"] == 40 and llm["finish_reason"] == "length"


@pytest.fixture(scope="module")
def omni_topk_engine(
    omni_ckpt: Path, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """(Built by export_store.py's build: the exports on both cores.)"""
    from edgeomni.export.family import BuildArgs

    eng = tmp_path_factory.mktemp("omni-topk") / "eng"
    args = BuildArgs(3, 128, 256, logits_topk=16)
    assert exports.build(omni_ckpt, eng, args, ["llm", "talker", "code_predictor", "code2wav"])
    return eng


@pytest.mark.parametrize(
    "sampling",
    [
        {"top_k": 1, "talker_top_k": 1},
        {"top_k": 1, "talker_top_k": 8, "cp_top_k": 6, "cp_top_p": 0.9, "talker_seed": 5},
        {"top_k": 1, "talker_seed": 11},  # transformers' talker defaults: top-k 50 > K
    ],
    ids=["greedy", "sampled", "defaults"],
)
def test_omni_codes_same_as_full_logits(omni_topk_engine, omni_engine, sampling) -> None:
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    body = {"max_generate_length": 8, **sampling, "talker_max_new_tokens": 12,
            "talker_min_new_tokens": 12,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": p}]}]}
                         for p in PROMPTS[:2]]}  # fmt: skip
    requests, _ = parse_request_file(body)
    ours = Pipeline(omni_topk_engine).run(requests, batch_size=2)
    full = Pipeline(omni_engine).run(requests, batch_size=2)
    for a, b in zip(ours, full, strict=True):
        assert a.entry["ok"] and b.entry["ok"], (a.entry, b.entry)
        # 12 talker tokens with EOS held back: 11 frames (the last token starts no frame)
        assert a.entry["stages"]["talker"]["frames"] == 11
        assert a.codes.shape == (11, 16)
        assert (a.codes == b.codes).all()
    talker = ours[0].entry["stages"]["talker"]
    if sampling.get("talker_top_k") == 8:
        assert talker["full_logit_rows"] < 2 * 13  # the top-K decided most frames


def test_gpu_builds_reduce_logits_by_default() -> None:
    from edgeomni.export.family import BuildArgs

    assert BuildArgs(1, 8, 16, device="cuda").logits_topk == 64
    assert BuildArgs(1, 8, 16).logits_topk == 0
    assert BuildArgs(1, 8, 16, device="cuda", logits_topk=0).logits_topk == 0
    with pytest.raises(ValueError, match="logits_topk"):
        BuildArgs(1, 8, 16, logits_topk=-1)
