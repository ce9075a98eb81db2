"""Qwen3.5's decoder (export/families/qwen3_5/model.py) against transformers' Qwen3_5ForCausalLM:
eager logits over a ragged prefill and decode steps with an idle row, and the ONNX graph lowered
for ONNX Runtime generating transformers' greedy tokens, states carried by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.families.qwen3_5 import model as qm
from edgeomni.plugins import lower_model

CAPACITY = 24
VOCAB = 128


def tiny(tie: bool, seed: int) -> tuple[Qwen3_5ForCausalLM, dict[str, Any]]:
    """A random 4-layer Qwen3.5 (three DeltaNet layers, then full attention), its zero-initialised
    (1 + w) norms perturbed so the offset is exercised."""
    cfg = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
    return model, cfg.to_dict()


def zero_states(module: qm.Qwen35CausalLM, batch: int) -> list[torch.Tensor]:
    return [torch.zeros(batch, *t.row_shape(CAPACITY)) for t in module.state_tensors()]


def call_inputs(hf: Qwen3_5ForCausalLM, rows: list[list[int]], past: list[int]) -> tuple:
    """One right-padded call: each row's new tokens (maybe none) after ``past`` cached ones."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    with torch.no_grad():
        embeds = hf.model.embed_tokens(ids)
    positions = torch.tensor(past)[:, None] + torch.arange(width)
    lens = [len(r) for r in rows]
    return (
        embeds,
        positions[None].repeat(3, 1, 1),
        torch.tensor(past, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor([max(n - 1, 0) for n in lens], dtype=torch.int64),
    )


def test_eager_logits_match_transformers_per_row() -> None:
    hf, config = tiny(tie=True, seed=0)  # the head read from the embedding table
    module = qm.load_qwen35(hf.state_dict(), config)
    prompts = [[5, 17, 99, 3, 42, 7], [64, 1, 88]]
    steps = [[[11], [23]], [[12], []], [[13], [24]]]  # row 1 sits out the second step
    # transformers, one row at a time, unpadded, with its own cache
    expected: list[list[torch.Tensor]] = []
    for b, prompt in enumerate(prompts):
        with torch.no_grad():
            out = hf(torch.tensor([prompt]), use_cache=True)
            logits, cache = [out.logits[0, -1]], out.cache
            for step in steps:
                if step[b]:
                    out = hf(torch.tensor([step[b]]), cache=cache, use_cache=True)
                    logits.append(out.logits[0, -1])
                    cache = out.cache
        expected.append(logits)
    states = zero_states(module, 2)
    past = [0, 0]
    seen = [0, 0]
    for call in [prompts, *steps]:
        args = call_inputs(hf, call, past)
        with torch.no_grad():
            logits, *presents = module(*args, *states)
        for b, tokens in enumerate(call):
            if tokens:
                torch.testing.assert_close(logits[b], expected[b][seen[b]], atol=1e-4, rtol=0)
                seen[b] += 1
            else:  # an idle row's states come back as they were
                for before, after in zip(states, presents, strict=True):
                    assert torch.equal(before[b], after[b])
            past[b] += len(tokens)
        states = presents
    assert seen == [4, 3]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """(transformers' model, our module, its ONNX path), exported once for the module."""
    hf, config = tiny(tie=False, seed=1)  # (tied, a random model repeats its last token)
    module = qm.load_qwen35(hf.state_dict(), config)
    path = export_causal_lm(module, tmp_path_factory.mktemp("qwen35") / "qwen35.onnx")
    graph = onnx.load(str(path))
    plugin_ops = {n.op_type for n in graph.graph.node if n.domain == "edgeomni"}
    assert plugin_ops == {"CachedAttention", "Rotary", "CausalConvState", "GatedDeltaRule"}
    return hf, module, path


def lowered_session(path: Path, backend: str) -> ort.InferenceSession:
    graph = onnx.load(str(path))
    lower_model(graph, backend)
    contrib = {n.op_type for n in graph.graph.node if n.domain == "com.microsoft"}
    if backend == "onnxruntime":
        assert {"GatedDeltaNet", "CausalConvWithState", "GroupQueryAttention"} <= contrib
    else:
        assert not contrib
    options = ort.SessionOptions()
    options.log_severity_level = 3  # TensorScatter's note that it copies a cache not bound in place
    return ort.InferenceSession(graph.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])  # fmt: skip


def test_onnx_runtime_greedy_matches_generate(exported: tuple) -> None:
    hf, module, path = exported
    sess = lowered_session(path, "onnxruntime")
    inputs, outputs = module.io_names()
    assert [i.name for i in sess.get_inputs()] == inputs
    assert [o.name for o in sess.get_outputs()] == outputs

    prompts, new = [[5, 17, 99, 3, 42], [64, 1, 88]], 8
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                              min_new_tokens=new, pad_token_id=0)  # fmt: skip
        expected.append(out[0, len(prompt) :].tolist())

    states = [s.numpy() for s in zero_states(module, 2)]
    eager_states = zero_states(module, 2)
    past, rows, got = [0, 0], prompts, [[], []]
    for _ in range(new):
        args = call_inputs(hf, rows, past)
        feeds = [a.numpy() for a in args] + states
        logits, *states = sess.run(None, dict(zip(inputs, feeds, strict=True)))
        with torch.no_grad():  # the graph computes what the module does
            eager, *eager_states = module(*args, *eager_states)
        np.testing.assert_allclose(logits, eager.numpy(), atol=1e-4, rtol=0)
        for b, tokens in enumerate(rows):
            past[b] += len(tokens)
            got[b].append(int(np.argmax(logits[b])))
        rows = [[g[-1]] for g in got]
    assert got == expected


def test_config_and_prefix_of_conditional_generation() -> None:
    """A ConditionalGeneration checkpoint: the text_config section, model.language_model.*."""
    hf, config = tiny(tie=False, seed=2)
    # the top level's tie_word_embeddings decides (transformers' composite model holds that one)
    nested = {"model_type": "qwen3_5", "text_config": dict(config, tie_word_embeddings=True),
              "tie_word_embeddings": False}  # fmt: skip
    state = {
        (k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
        for k, v in hf.state_dict().items()
    }
    module = qm.load_qwen35(state, nested, prefix="model.language_model.")
    reference = qm.load_qwen35(hf.state_dict(), config)
    for (name, a), (_, b) in zip(module.state_dict().items(), reference.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    cfg = module.cfg
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (cfg.rotary_dim, cfg.mrope_section, cfg.conv_dim) == (8, (2, 1, 1), 64)
    specs = [t.describe() for t in module.state_tensors()]
    assert [s["name"] for s in specs] == ["conv_0", "recurrent_0", "conv_1", "recurrent_1",
                                          "conv_2", "recurrent_2", "key_3", "value_3"]  # fmt: skip
    assert specs[0] == {"name": "conv_0", "kind": "conv", "input": "past_conv_0",
                        "output": "present_conv_0", "shape": [64, 3], "dtype": "float32",
                        "lengths": ["query_lens"]}  # fmt: skip
    assert specs[1]["shape"] == [4, 8, 8] and specs[1]["kind"] == "recurrent"
    assert specs[6]["shape"] == [2, "capacity", 32]
    assert specs[6]["lengths"] == ["past_lens", "query_lens"]
    with pytest.raises(CheckpointError, match="layer_types"):
        qm.config_from(dict(config, layer_types=["mamba"] * 4))


def test_tensorrt_lowering_runs_as_the_module(exported: tuple) -> None:
    """The plain-ONNX (TensorRT) lowering, run by ONNX Runtime: a ragged prefill, a step with an
    idle row, a step with both, each logit row as the eager module's."""
    hf, module, path = exported
    sess = lowered_session(path, "tensorrt")
    inputs, _ = module.io_names()
    states = [s.numpy() for s in zero_states(module, 2)]
    eager_states = zero_states(module, 2)
    past = [0, 0]
    for rows in ([[5, 17, 99, 3, 42], [64, 1, 88]], [[1], []], [[2], [3]]):
        args = call_inputs(hf, rows, past)
        before = states
        logits, *states = sess.run(None, dict(zip(inputs, [a.numpy() for a in args] + states,
                                                  strict=True)))  # fmt: skip
        with torch.no_grad():
            eager, *eager_states = module(*args, *eager_states)
        for b, tokens in enumerate(rows):
            if tokens:
                np.testing.assert_allclose(logits[b], eager[b].numpy(), atol=1e-4, rtol=0)
            else:
                for old, new in zip(before, states, strict=True):
                    np.testing.assert_array_equal(old[b], new[b])
            past[b] += len(tokens)


def test_mrope_matches_transformers_with_distinct_axes() -> None:
    """Interleaved MRoPE over the rotary part: cos/sin as transformers' for t/h/w positions that
    differ (a vision grid's), not only text's equal ones."""
    hf, config = tiny(tie=False, seed=3)
    module = qm.load_qwen35(hf.state_dict(), config)
    positions = torch.randint(0, 500, (3, 2, 7))
    cos, sin = module.model.rotary(positions)
    hf_cos, hf_sin = hf.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(cos, hf_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, hf_sin, atol=1e-6, rtol=0)
