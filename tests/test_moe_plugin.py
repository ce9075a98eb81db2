"""edgeomni::MoE: the ONNX Runtime lowering equals the numpy reference, and our Qwen3-Omni blocks,
exported through the plugin op and lowered, equal transformers' own sparse MoE blocks."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from edgeomni.export.common.moe import (
    TalkerSparseMoE,
    ThinkerSparseMoE,
    interleave_gate_up,
    load_moe_block,
)
from edgeomni.export.common.onnx_export import export_onnx
from edgeomni.plugins import lower_model, moe

H, INTER, E = 32, 16, 6
PREFIX = "talker.model.layers.1.mlp."


def tolerance(ref: np.ndarray) -> float:
    """~2e-6 absolute at |out| ~ 1, scaled with the output's size."""
    return 2e-6 * max(1.0, float(np.abs(ref).max()))


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------------------------
# (a) one-node graph: lowering vs numpy reference (and the eager torch op)
# ---------------------------------------------------------------------------------------------
def moe_model(top_k: int, normalize: int, backend: str = "onnxruntime") -> onnx.ModelProto:
    moe.register_onnx_schema()
    f, vi = TensorProto.FLOAT, helper.make_tensor_value_info
    inputs = [
        vi("x", f, [None, H]),
        vi("router_logits", f, [None, E]),
        vi("fc1", f, [E, 2 * INTER, H]),
        vi("fc2", f, [E, H, INTER]),
    ]
    names = [i.name for i in inputs]
    node = helper.make_node(
        "MoE", names, ["y"], domain=moe.DOMAIN, top_k=top_k, normalize_routing=normalize
    )
    model = helper.make_model(
        helper.make_graph([node], "moe", inputs, [vi("y", f, [None, H])]),
        opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid(moe.DOMAIN, 1)],
    )
    lower_model(model, backend)
    if backend == "tensorrt":  # plain ops only
        assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
        assert {"MatMul", "TopK", "ScatterElements"} <= {n.op_type for n in model.graph.node}
        return model
    lowered, *scaling = model.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in lowered.attribute}
    assert (lowered.domain, lowered.op_type) == ("com.microsoft", "MoE")
    assert list(lowered.input) == ["x", "router_logits", "fc1", "", "fc2"]
    assert attrs["swiglu_fusion"] == 1 and attrs["activation_type"] == b"swiglu"
    # the op always normalises; unnormalised routing scales its output by the chosen mass
    assert (attrs["k"], attrs["normalize_routing_weights"]) == (top_k, 1)
    assert [n.op_type for n in scaling] == ([] if normalize else
                                            ["Softmax", "TopK", "ReduceSum", "Mul"])  # fmt: skip
    return model


@pytest.mark.parametrize("backend", ["onnxruntime", "tensorrt"])
@pytest.mark.parametrize("normalize", [0, 1])
@pytest.mark.parametrize("top_k", range(1, E + 1))
def test_lowering_matches_reference(top_k: int, normalize: int, backend: str) -> None:
    sess = session(moe_model(top_k, normalize, backend))
    rng = np.random.default_rng(top_k + 10 * normalize)
    fc1 = (rng.standard_normal((E, 2 * INTER, H)) / math.sqrt(H)).astype(np.float32)
    fc2 = (rng.standard_normal((E, H, INTER)) / math.sqrt(INTER)).astype(np.float32)
    for t in (1, 2, 7, 257):
        x = rng.standard_normal((t, H), dtype=np.float32)
        logits = 2 * rng.standard_normal((t, E), dtype=np.float32)
        ref = moe.reference(x, logits, fc1, fc2, top_k=top_k, normalize_routing=normalize)
        out = sess.run(None, {"x": x, "router_logits": logits, "fc1": fc1, "fc2": fc2})[0]
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance(ref))
        args = [torch.from_numpy(a) for a in (x, logits, fc1, fc2)]
        eager = moe.torch_op()(*args, top_k, normalize).numpy()
        np.testing.assert_allclose(eager, ref, rtol=0, atol=tolerance(ref))


def test_fc1_layout_matters() -> None:
    """HF's [gate | up] rows fed as if interleaved give another answer: the layout is checked."""
    rng = np.random.default_rng(1)
    gate, up = (rng.standard_normal((2, E, INTER, H)) / math.sqrt(H)).astype(np.float32)
    fc2 = (rng.standard_normal((E, H, INTER)) / math.sqrt(INTER)).astype(np.float32)
    x, logits = rng.standard_normal((9, H)), rng.standard_normal((9, E))
    fc1 = interleave_gate_up(torch.from_numpy(gate), torch.from_numpy(up)).numpy()
    assert np.array_equal(fc1[:, 0::2], gate) and np.array_equal(fc1[:, 1::2], up)
    right = moe.reference(x, logits, fc1, fc2, top_k=2, normalize_routing=1)
    wrong = moe.reference(
        x, logits, np.concatenate([gate, up], 1), fc2, top_k=2, normalize_routing=1
    )
    assert np.abs(right - wrong).max() > 0.1


# ---------------------------------------------------------------------------------------------
# (b, c) transformers' Qwen3-Omni blocks vs ours, eager and exported + lowered
# ---------------------------------------------------------------------------------------------
def hf_block(kind: str) -> torch.nn.Module:
    """transformers' block from a tiny Qwen3OmniMoeConfig, every weight redrawn at 1/sqrt(fan_in)
    (HF leaves the talker router at zero: top-k ties would make any comparison arbitrary)."""
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    text = dict(hidden_size=H, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=INTER)
    cfg = Qwen3OmniMoeConfig(
        thinker_config={"text_config": text},
        talker_config={"text_config": {**text, "shared_expert_intermediate_size": 24}},
    )
    torch.manual_seed(0 if kind == "thinker" else 1)
    if kind == "thinker":
        text_cfg = cfg.thinker_config.text_config
        block = hf.Qwen3OmniMoeThinkerTextSparseMoeBlock(text_cfg)
    else:
        text_cfg = cfg.talker_config.text_config
        block = hf.Qwen3OmniMoeTalkerTextSparseMoeBlock(text_cfg)
    block.config = text_cfg  # what our from_config reads
    text_cfg._experts_implementation = "eager"  # HF's reference loop, not a dispatch guess
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    return block.eval()


def ours(kind: str, block: torch.nn.Module, layout: str) -> ThinkerSparseMoE:
    """Our module, filled by load_moe_block from HF's in-memory (fused) names or from the
    per-expert names checkpoints hold on disk."""
    state = {PREFIX + k: v for k, v in block.state_dict().items()}
    if layout == "per_expert":
        gate_up = state.pop(PREFIX + "experts.gate_up_proj")
        down = state.pop(PREFIX + "experts.down_proj")
        for e in range(gate_up.shape[0]):
            gate, up = gate_up[e].chunk(2, dim=0)
            state[f"{PREFIX}experts.{e}.gate_proj.weight"] = gate
            state[f"{PREFIX}experts.{e}.up_proj.weight"] = up
            state[f"{PREFIX}experts.{e}.down_proj.weight"] = down[e]
    cls = ThinkerSparseMoE if kind == "thinker" else TalkerSparseMoE
    module = cls.from_config(block.config)
    load_moe_block(module, state.__getitem__, PREFIX)
    return module.eval()


@pytest.mark.parametrize("layout", ["fused", "per_expert"])
@pytest.mark.parametrize("kind", ["thinker", "talker"])
def test_eager_block_matches_transformers(kind: str, layout: str) -> None:
    block = hf_block(kind)
    module = ours(kind, block, layout)
    assert module.normalize is (kind == "thinker")
    x = torch.randn(2, 11, H)
    with torch.no_grad():
        ref, out = block(x).numpy(), module(x).numpy()
    np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance(ref))


@pytest.fixture(scope="module", params=["thinker", "talker"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """(kind, HF block, our block exported with dynamic batch and sequence, not yet lowered)."""
    from torch.export import Dim

    kind = request.param
    block = hf_block(kind)
    path = export_onnx(
        ours(kind, block, "per_expert"),
        (torch.randn(2, 3, H),),
        tmp_path_factory.mktemp(kind) / "moe.onnx",
        input_names=["x"],
        output_names=["y"],
        dynamic_shapes=({0: Dim("batch"), 1: Dim("seq")},),
    )
    return kind, block, onnx.load(str(Path(path)))


def run_lowered(model: onnx.ModelProto, x: torch.Tensor) -> np.ndarray:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    lower_model(model, "onnxruntime")
    assert [n.op_type for n in model.graph.node if n.domain == "com.microsoft"] == ["MoE"]
    return session(model).run(None, {"x": x.numpy()})[0]


def test_exported_block_matches_transformers(exported) -> None:  # noqa: ANN001
    kind, block, model = exported
    plugin_nodes = [n for n in model.graph.node if n.domain == moe.DOMAIN]
    assert [n.op_type for n in plugin_nodes] == ["MoE"]
    for b, s in ((1, 1), (2, 5), (1, 257)):
        x = torch.randn(b, s, H)
        with torch.no_grad():
            ref = block(x).numpy()
        out = run_lowered(model, x)
        assert out.shape == (b, s, H)
        np.testing.assert_allclose(out, ref, rtol=0, atol=tolerance(ref))


def test_wrong_normalize_is_caught(exported) -> None:  # noqa: ANN001
    """Flipping normalize_routing in the exported graph must break parity: the test can fail."""
    kind, block, model = exported
    model = onnx.ModelProto.FromString(model.SerializeToString())
    (node,) = [n for n in model.graph.node if n.domain == moe.DOMAIN]
    (attr,) = [a for a in node.attribute if a.name == "normalize_routing"]
    assert attr.i == (1 if kind == "thinker" else 0)
    attr.i = 1 - attr.i
    x = torch.randn(2, 9, H)
    with torch.no_grad():
        ref = block(x).numpy()
    assert np.abs(run_lowered(model, x) - ref).max() > 0.05


def test_the_fused_moe_groups_prefills_and_wide_decode_steps_by_expert() -> None:
    """plugins/moe_cuda.py's grouped kernels: a prefill of more slots than experts, a decode
    step of more than 4 slots an expert; never 1024 experts or more (moe_group is one block),
    and their launches refuse such a layer."""
    from edgeomni.plugins import moe_cuda

    assert moe_cuda.grouped(17, 8, 128) and not moe_cuda.grouped(16, 8, 128)
    assert not moe_cuda.grouped(64, 8, 128, prefill=False)
    assert moe_cuda.grouped(65, 8, 128, prefill=False)
    assert not moe_cuda.grouped(4096, 8, 1024)
    names = list(moe_cuda.launches(600, 2048, 768, 8, 128))
    assert names == ["moe_route", "moe_group", "moe_norm", "moe_gate_up_grouped",
                     "moe_down_grouped", "moe_combine"]  # fmt: skip
    assert list(moe_cuda.launches(1, 2048, 768, 8)) == ["moe_route", "moe_gate_up", "moe_down"]
    # float16 prefills run the experts' products as GEMMs, a block a tile of 64 slots: at most
    # ceil(slots / 64) + experts tiles
    assert moe_cuda.uses_gemm(True, "float16", 2048, 768)
    assert not moe_cuda.uses_gemm(False, "float16", 2048, 768)  # decode: the SIMT kernels' bits
    assert not moe_cuda.uses_gemm(True, "float32", 2048, 768)
    assert not moe_cuda.uses_gemm(True, "float16", 2048, 760)  # K the GEMM's steps miss
    shapes = moe_cuda.launches(600, 2048, 768, 8, 128, gemm=True)
    assert list(shapes)[3:5] == ["moe_gate_up_gemm", "moe_down_gemm"]
    assert shapes["moe_gate_up_gemm"][0] == (24, 75 + 128) and shapes["moe_down_gemm"][0][0] == 32
    with pytest.raises(ValueError, match="fewer than 1024 experts"):
        moe_cuda.launches(4096, 64, 64, 8, 1024)
