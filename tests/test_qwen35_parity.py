"""Parity: a tiny random Qwen3.5 (Gated DeltaNet and gated attention layers) built and run
through edgeomni gives transformers' greedy tokens, alone, in a ragged batch, and with requests
joining and leaving a running batch whose rows earlier requests used (a later request never
sees an earlier one's recurrent or convolution state)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_inflight as inflight  # the in-flight tests' prompts, lengths and request body
import torch
from test_inflight import LENGTHS, PROMPTS, body
from test_qwen3_parity import hf_greedy

from edgeomni.runtime import cli


@pytest.fixture(scope="module")
def hf(qwen35_ckpt: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen35_ckpt, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(qwen35_ckpt)


def run(engine: Path, obj: dict, batch_size: int, batching: str = "inflight") -> list[list[int]]:
    outcomes = inflight.run(engine, obj, batch_size, batching)
    assert all(o.entry["ok"] for o in outcomes), [o.entry["error"] for o in outcomes]
    return inflight.tokens(outcomes)


def test_one_prompt_matches_transformers(qwen35_engine: Path, hf, tmp_path: Path) -> None:
    pred = tmp_path / "p.json"
    code = cli.main(["--config", str(qwen35_engine), "--prompt", PROMPTS[3], "--sampling",
                     '{"top_k": 1}', "--max-generate-length", "24", "--output-file", str(pred)])  # fmt: skip
    assert code == cli.EXIT_OK
    entry = json.loads(pred.read_text())["responses"][0]
    assert entry["stages"]["llm"]["output_tokens"] == hf_greedy(hf, PROMPTS[3], 24)


def test_requests_joining_and_leaving_match_transformers(qwen35_engine: Path, hf,
                                                         monkeypatch) -> None:  # fmt: skip
    """Six prompts of different lengths through three rows (right-padded prefills, rows
    sitting steps out, rows moved down as the batch drains, rows reused by later requests):
    every request's tokens are transformers' alone, in-flight and in cohorts."""
    from edgeomni.runtime.decoder_stage import DecoderStage

    moves: list[tuple[int, int]] = []
    real_move = DecoderStage.move

    def move(self, slot, row):  # noqa: ANN001, ANN202
        moves.append((slot.row, row))
        real_move(self, slot, row)

    monkeypatch.setattr(DecoderStage, "move", move)
    expected = [hf_greedy(hf, p, n) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    assert run(qwen35_engine, body(), 3) == expected
    assert moves, "the draining batch moved no row down"  # its states moved with it
    assert run(qwen35_engine, body(), 3, "cohort") == expected


def test_a_reused_row_starts_from_zero_state(qwen35_engine: Path, hf, monkeypatch) -> None:
    """The allocator zeroes a new request's recurrent and convolution rows: without that reset
    a request in a row an earlier one used continues the earlier state (llama.cpp shipped that
    bug), and its tokens are no longer transformers'."""
    from edgeomni.runtime.row_state import RowState

    obj = body()
    expected = [hf_greedy(hf, p, n) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    monkeypatch.setattr(RowState, "reset_rows", lambda self, start, n=1: None)
    assert run(qwen35_engine, obj, 1) != expected  # one row, reused by every request


def test_the_declared_state_is_the_engines(qwen35_engine: Path) -> None:
    """config.json declares each DeltaNet layer's conv and recurrent state and each attention
    layer's KV, and --validate-config checks them against the model's inputs and outputs."""
    cfg = json.loads((qwen35_engine / "config.json").read_text())
    kinds = [(t["name"], t["kind"]) for t in cfg["state"]]
    assert kinds == [("conv_0", "conv"), ("recurrent_0", "recurrent"), ("conv_1", "conv"),
                     ("recurrent_1", "recurrent"), ("conv_2", "conv"),
                     ("recurrent_2", "recurrent"), ("key_3", "kv"), ("value_3", "kv")]  # fmt: skip
    assert cli.main(["--config", str(qwen35_engine), "--validate-config"]) == cli.EXIT_OK


def test_a_fused_build_builds_the_llm_with_its_own_kernels(qwen35_ckpt: Path, tmp_path,
                                                            caplog) -> None:  # fmt: skip
    """--backend fused runs Qwen3.5's DeltaNet and gated attention layers with its own kernels
    (tests/test_fused_gpu.py ran them on a GPU): the llm is a fused engine, the log says so,
    and its config declares the DeltaNet layers' row state as the ONNX build does."""
    import logging

    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    caplog.set_level(logging.INFO, logger="edge-build")
    engine = tmp_path / "eng"
    args = BuildArgs(2, 32, 64, backend="fused", device="cuda", dtype="float32")
    assert build(qwen35_ckpt, engine, args) is not None
    cfg = json.loads((engine / "config.json").read_text())
    assert cfg["backend"] == "fused" and "fused_refused" not in cfg
    assert "llm: fused, 4 layers" in caplog.text
    assert [t["kind"] for t in cfg["state"]][:2] == ["conv", "recurrent"]


def test_an_onnxruntime_without_the_deltanet_kernels_is_refused(qwen35_engine: Path,
                                                                qwen3_engine: Path,
                                                                monkeypatch) -> None:  # fmt: skip
    """The engine records that its lowering uses GatedDeltaNet and CausalConvWithState (ONNX
    Runtime 1.32); an older onnxruntime is refused before loading, naming both, while an engine
    without DeltaNet layers records nothing of them."""
    import onnxruntime

    from edgeomni.runtime.engine import EngineError, check_engine

    cfg = json.loads((qwen35_engine / "config.json").read_text())
    assert cfg["lowering"]["gated_delta_net"] is True
    qwen3 = json.loads((qwen3_engine / "config.json").read_text())
    assert "gated_delta_net" not in qwen3["lowering"]
    monkeypatch.setattr(onnxruntime, "__version__", "1.31.1")
    with pytest.raises(EngineError, match="needs 1.32 or later \\(.*GatedDeltaNet and "
                                          "CausalConvWithState"):  # fmt: skip
        check_engine(qwen35_engine, cfg)
