"""Parity: a tiny random Qwen3 built and run through edge-infer gives transformers' greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edgeomni.runtime import cli

PROMPTS = [
    "Hello! How are you today?",
    "What is the capital of France?",
    "Hi",
    "The quick brown fox jumps over the lazy dog. Speech models turn text into audio.",
]
MAX_NEW = 24


@pytest.fixture(scope="module")
def hf(qwen3_ckpt: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen3_ckpt, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(qwen3_ckpt)


def hf_greedy(hf, prompt: str, max_new: int = MAX_NEW) -> list[int]:
    model, tok = hf
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


def run_file(engine: Path, tmp_path: Path, body: dict, *extra: str) -> tuple[int, list[dict]]:
    req = tmp_path / "requests.json"
    req.write_text(json.dumps(body))
    pred = tmp_path / "predictions.json"
    code = cli.main(
        ["--config", str(engine), "--input-file", str(req), "--output-file", str(pred), *extra]
    )
    return code, json.loads(pred.read_text())["responses"]


def test_one_prompt_matches_transformers(qwen3_engine: Path, hf, tmp_path: Path, capsys) -> None:
    expected = hf_greedy(hf, PROMPTS[0])
    pred = tmp_path / "p.json"
    code = cli.main(
        [
            "--config", str(qwen3_engine),
            "--prompt", PROMPTS[0],
            "--sampling", '{"top_k": 1}',
            "--max-generate-length", str(MAX_NEW),
            "--output-file", str(pred),
        ]
    )  # fmt: skip
    assert code == cli.EXIT_OK
    entry = json.loads(pred.read_text())["responses"][0]
    assert entry["ok"] and entry["error"] is None
    assert entry["stages"]["llm"]["output_tokens"] == expected
    text = capsys.readouterr().out.strip()
    assert text == entry["output_text"].strip()
    eos = hf[0].generation_config.eos_token_id
    body = [t for t in expected if t != eos]
    assert entry["output_text"] == hf[1].decode(body, skip_special_tokens=True)


def test_batched_file_matches_transformers(qwen3_engine: Path, hf, tmp_path: Path) -> None:
    """Four prompts of different lengths in cohorts of 3 then 1: each row equals running alone."""
    expected = [hf_greedy(hf, p) for p in PROMPTS]
    body = {
        "temperature": 0,
        "max_generate_length": MAX_NEW,
        "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS],
    }
    code, entries = run_file(qwen3_engine, tmp_path, body, "--batch-size", "3")
    assert code == cli.EXIT_OK
    assert [e["request_idx"] for e in entries] == [0, 1, 2, 3]
    assert [e["stages"]["llm"]["output_tokens"] for e in entries] == expected
    assert [e["stages"]["llm"]["cohort_size"] for e in entries] == [3, 3, 3, 1]
    lengths = {e["stages"]["llm"]["prompt_tokens"] for e in entries}
    assert len(lengths) == len(PROMPTS)  # genuinely ragged batch
    # a wider --batch-size is still capped by the build's max_batch (3)
    code, entries = run_file(qwen3_engine, tmp_path, body, "--batch-size", "8")
    assert code == cli.EXIT_OK
    assert [e["stages"]["llm"]["cohort_size"] for e in entries] == [3, 3, 3, 1]
    assert [e["stages"]["llm"]["output_tokens"] for e in entries] == expected


def test_bad_requests_fail_alone(qwen3_engine: Path, tmp_path: Path) -> None:
    body = {
        "temperature": 0,
        "max_generate_length": 8,
        "requests": [
            {"messages": [{"role": "user", "content": "Hello"}]},
            {"messages": [{"role": "user", "content": "word " * 200}]},  # over max_input_len 64
            {"messages": [{"role": "user", "content": "Hi"}], "sampling": {"warmth": 2}},
            {"messages": [{"role": "user", "content": "Hi"}], "max_generate_length": 500},
            {"messages": "not a list"},
            {"messages": [{"role": "user", "content": "Paris"}]},
        ],
    }
    code, entries = run_file(qwen3_engine, tmp_path, body, "--batch-size", "2")
    assert code == cli.EXIT_REQUESTS_FAILED
    assert [e["ok"] for e in entries] == [True, False, False, False, False, True]
    assert "--max-input-len" in entries[1]["error"]
    assert "warmth" in entries[2]["error"]
    assert "--max-kv-cache-capacity" in entries[3]["error"]
    assert "messages" in entries[4]["error"]
    assert entries[5]["stages"]["llm"]["generated_tokens"] >= 1
