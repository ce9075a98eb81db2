"""The GPU build's engines, run on the CPU provider: same tokens and codes as the CPU build.

A ``--device cuda`` build lowers attention for the GPU (GroupQueryAttention's lengths fed by the
host; for onnxruntime-gpu before 1.32, no per-row query lengths: a cohort's prefill is one
right-padded call from an empty cache) and
reduces logits to a top-K in the graph. Those engines are provider-neutral, so CI runs them here
with the device switched to cpu in their config: everything of the GPU path but device memory and
CUDA graphs (tests/test_gpu.py covers those on a GPU). A float32 build gets plain-op attention
(what float32 engines run on the CUDA provider); the LLM test lowers as a float16 build does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_store import ExportStore

from edgeomni.plugins import lowering

ONNXRUNTIME_GPU = "1.31.1"  # the newest onnxruntime-gpu on PyPI as of this writing


def gpu_build_on_cpu(
    ckpt: Path, out: Path, monkeypatch, exports: ExportStore, components=None, gqa: bool = False
) -> Path:
    """A float32 ``--device cuda`` build (exact against the CPU build). Its attention is plain
    ops, as every float32 engine's on the CUDA provider; ``gqa`` lowers it as a float16 build's
    (GroupQueryAttention with host-fed lengths) instead. The tests here differ in the lowering
    only: the first exports each component, the others reuse its raw ONNX (export_store.py)."""
    from edgeomni.builder import onnxruntime as ort_builder
    from edgeomni.export.family import BuildArgs

    with monkeypatch.context() as m:  # lower as for the onnxruntime-gpu we deploy on, but
        # without the q/k norms inside GroupQueryAttention, which the CPU provider cannot run
        # (test_attention_prologue_fuses_for_cuda below checks that fusion)
        m.setattr(lowering, "onnxruntime_options", lambda v=None: {
            "gqa_query_seqlens": False, "qk_norm_attention": False,
            "onnxruntime": ONNXRUNTIME_GPU})  # fmt: skip
        if gqa:
            lowered = ort_builder.cuda_lowering
            m.setattr(ort_builder, "cuda_lowering",
                      lambda model: {**lowered(model), "plain_attention": False})  # fmt: skip
        assert exports.build(ckpt, out, BuildArgs(3, 128, 256, device="cuda"), components)
    for cfg_path in out.rglob("config.json"):
        cfg = json.loads(cfg_path.read_text())
        if cfg.get("device") == "cuda":
            cfg["device"] = "cpu"
            cfg_path.write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def mp():
    with pytest.MonkeyPatch.context() as m:
        yield m


def run(engine: Path, body: dict, batch: int) -> list:
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    return Pipeline(engine).run(requests, batch_size=batch)


PROMPTS = ["Hello! How are you today?", "Hi", "What is the capital of France?"]


def test_llm(qwen3_ckpt, qwen3_engine, tmp_path, mp, exports) -> None:
    eng = gpu_build_on_cpu(qwen3_ckpt, tmp_path / "eng", mp, exports, gqa=True)
    cfg = json.loads((eng / "config.json").read_text())
    assert cfg["lowering"]["gqa_query_seqlens"] is False  # the 3 prompts: one right-padded prefill
    model = onnx.load(str(eng / "llm.onnx"))
    assert "gqa_seqlens_k" in [i.name for i in model.graph.input]
    # rotary in one node per q and k; each layer's two residual Adds (and the final norm's)
    # inside SkipSimplifiedLayerNormalization
    layers = json.loads((qwen3_ckpt / "config.json").read_text())["num_hidden_layers"]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("RotaryEmbedding") == 2 * layers
    assert ops.count("SkipSimplifiedLayerNormalization") == cfg["lowering"]["fused_residual_norms"]
    assert cfg["lowering"]["fused_residual_norms"] == 2 * layers
    body = {"temperature": 0.7, "top_k": 10, "seed": 4, "max_generate_length": 12,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}  # fmt: skip
    ours, ref = run(eng, body, 3), run(qwen3_engine, body, 3)
    for a, b in zip(ours, ref, strict=True):
        assert (
            a.entry["stages"]["llm"]["output_tokens"] == b.entry["stages"]["llm"]["output_tokens"]
        )


def test_omni_text_to_speech(omni_ckpt, omni_engine, tmp_path, mp, exports) -> None:
    eng = gpu_build_on_cpu(omni_ckpt, tmp_path / "eng", mp, exports,
                           ["llm", "talker", "code_predictor", "code2wav"])  # fmt: skip
    # float32 engines get plain-op attention (no float32 GroupQueryAttention kernel on the CUDA
    # provider): the decoders with their caches, and code2wav's sliding window
    for sub, engine in ((".", "llm.onnx"), ("talker", "llm.onnx"), ("code2wav", "code2wav.onnx")):
        assert json.loads((eng / sub / "config.json").read_text())["lowering"]["plain_attention"]
        model = onnx.load(str(eng / sub / engine), load_external_data=False)
        assert not any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    body = {"max_generate_length": 8, "top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 13,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": p}]}]}
                         for p in PROMPTS]}  # fmt: skip
    ours, ref = run(eng, body, 3), run(omni_engine, body, 3)
    for a, b in zip(ours, ref, strict=True):
        assert a.entry["ok"], a.entry
        assert (
            a.entry["stages"]["thinker"]["output_tokens"]
            == (b.entry["stages"]["thinker"]["output_tokens"])
        )
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_allclose(a.audio, b.audio, atol=1e-5)


FLOAT = onnx.TensorProto.FLOAT


def embeds_inputs(model) -> dict[str, tuple[int, list[str]]]:
    """Each embedding input (``*_embeds``): its element type and the ops that read it."""
    out = {}
    for value in model.graph.input:
        if value.name.endswith("_embeds"):
            readers = [n.op_type for n in model.graph.node if value.name in n.input]
            out[value.name] = (value.type.tensor_type.elem_type, readers)
    return out


def test_attention_prologue_fuses_for_cuda(qwen3_ckpt, omni_ckpt, tmp_path, mp, exports) -> None:
    """A float16 cuda build for onnxruntime-gpu 1.31+: each 1-D RoPE decoder layer's q/k norms
    and rotary run inside GroupQueryAttention (packed QKV, norm weights, a cos/sin table by
    position); MRoPE decoders (Qwen3-Omni's thinker and talker) keep theirs. Only the graph is
    checked here: the CPU provider has no q/k norm in GroupQueryAttention, so the numbers are
    checked on a GPU (tests/test_gpu.py, against the CPU build)."""
    from safetensors.torch import load_file

    from edgeomni.export.family import BuildArgs

    with mp.context() as m:
        m.setattr(lowering, "onnxruntime_options", lambda v=None: {
            "gqa_query_seqlens": False, "qk_norm_attention": True,
            "onnxruntime": ONNXRUNTIME_GPU})  # fmt: skip
        llm, omni = tmp_path / "llm", tmp_path / "omni"
        args = BuildArgs(2, 32, 64, device="cuda", dtype="float16")
        assert exports.build(qwen3_ckpt, llm, args)
        assert exports.build(omni_ckpt, omni, args, ["llm", "talker", "code_predictor"])

    hf = json.loads((qwen3_ckpt / "config.json").read_text())
    model = onnx.load(str(llm / "llm.onnx"))
    cfg = json.loads((llm / "config.json").read_text())
    layers = hf["num_hidden_layers"]
    assert embeds_inputs(model) == {"inputs_embeds": (FLOAT, ["Cast"])}
    assert cfg["lowering"]["fused_attention_prologue"] == layers
    ops = [n.op_type for n in model.graph.node]
    for gone in ("RotaryEmbedding", "Cos", "Sin"):
        assert gone not in ops
    # left: each layer's MLP split; the first layer's input norm
    assert ops.count("Split") == layers and ops.count("RMSNormalization") == 1
    producer = {o: n for n in model.graph.node for o in n.output}
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == layers
    weights = load_file(qwen3_ckpt / "model.safetensors")
    for i, node in enumerate(gqa):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 0
        assert attrs["qk_norm_epsilon"] == pytest.approx(hf["rms_norm_eps"])
        assert producer[node.input[0]].op_type == "MatMul" and node.input[1:3] == ["", ""]
        assert node.input[9] == "position_ids"
        for k, norm in ((14, "q_norm"), (15, "k_norm")):  # (equal weights may share a name)
            want = weights[f"model.layers.{i}.self_attn.{norm}.weight"].float().numpy()
            np.testing.assert_array_equal(init[node.input[k]], want.astype(np.float16))
    # the tables: cos/sin(position * inv_freq) for every position the cache can hold
    dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    inv_freq = 1.0 / hf.get("rope_theta", 10000.0) ** (np.arange(0, dim, 2) / dim)
    angles = np.arange(64)[:, None] * inv_freq[None]
    for k, fn in ((7, np.cos), (8, np.sin)):
        table = init[gqa[0].input[k]]
        assert table.shape == (64, dim // 2) and table.dtype == np.float16
        np.testing.assert_allclose(table.astype(np.float64), fn(angles), atol=1e-3)
        assert all(n.input[k] == gqa[0].input[k] for n in gqa)  # one table for every layer

    # onnxruntime accepts the folded graph (schema, types, shapes); running it needs the CUDA
    # provider, whose GroupQueryAttention has the q/k norm inputs
    import onnxruntime as ort

    ort.InferenceSession(str(llm / "llm.onnx"), providers=["CPUExecutionProvider"])

    # every decoder of the omni build folds: the code predictor's 1-D RoPE with a table by
    # position, the thinker's and talker's MRoPE with the call's own per-token rows
    for sub in (".", "talker", "code_predictor"):
        cfg = json.loads((omni / sub / "config.json").read_text())
        assert cfg["lowering"]["fused_attention_prologue"] == cfg["num_hidden_layers"], sub
    # the thinker's host-fed embeddings stay float32, cast inside; the talker's come from the
    # code predictor's float16 output on the device, read as they are
    thinker = embeds_inputs(onnx.load(str(omni / "llm.onnx"), load_external_data=False))
    assert thinker["inputs_embeds"] == (FLOAT, ["Cast"])
    assert set(thinker) <= {"inputs_embeds", "deepstack_embeds"}
    if "deepstack_embeds" in thinker:  # read for its shape too
        kind, readers = thinker["deepstack_embeds"]
        assert kind == FLOAT and "Cast" in readers and set(readers) <= {"Cast", "Shape"}
    talker = onnx.load(str(omni / "talker" / "llm.onnx"), load_external_data=False)
    assert embeds_inputs(talker)["inputs_embeds"][0] == onnx.TensorProto.FLOAT16
    for sub in (".", "talker"):
        model = onnx.load(str(omni / sub / "llm.onnx"))
        ops = [n.op_type for n in model.graph.node]
        assert "RotaryEmbedding" not in ops and ops.count("Pad") == 2  # one cos, one sin table
        producer = {o: n for n in model.graph.node for o in n.output}
        for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
            assert producer[node.input[7]].op_type == "Pad" and node.input[1:3] == ["", ""]
            assert producer[node.input[9]].op_type == "Reshape"  # token (b, s) -> row b*S + s
            assert node.input[14] and node.input[15]  # q/k norm weights
        assert host_values_on_device(model) == []  # still capturable as a CUDA graph
        ort.InferenceSession(str(omni / sub / "llm.onnx"), providers=["CPUExecutionProvider"])


def test_mrope_rotary_folds_exactly(omni_ckpt, tmp_path, mp, exports) -> None:
    """The MRoPE fold's rotary part on the CPU provider (which has GroupQueryAttention's rotary
    but not its q/k norms, so the norms stay outside here): the thinker and the talker with
    their rotary inside GroupQueryAttention, over the call's per-token cos/sin rows padded to
    the cache length, give the unfolded engines' logits, prefill and the decode step after."""
    import shutil

    import prefill_check

    from edgeomni.builder.ort_fusions import fuse_attention_prologue

    eng = gpu_build_on_cpu(omni_ckpt, tmp_path / "eng", mp, exports, ["llm", "talker"], gqa=True)
    for sub in (".", "talker"):
        folded = tmp_path / f"folded-{sub.strip('.') or 'thinker'}"
        shutil.copytree(eng / sub, folded)
        model = onnx.load(str(folded / "llm.onnx"))
        layers = json.loads((folded / "config.json").read_text())["num_hidden_layers"]
        assert fuse_attention_prologue(model, 32, norms=False) == layers
        assert "RotaryEmbedding" not in [n.op_type for n in model.graph.node]
        onnx.save(model, str(folded / "llm.onnx"))
        for a, b in zip(prefill_check.batched_and_rowwise(eng / sub),
                        prefill_check.batched_and_rowwise(folded), strict=True):  # fmt: skip
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


# inputs onnxruntime's CUDA kernels read from host memory (shapes, axes, bounds): a value
# computed on the host from a shape may go there without a copy. Deliberately short: an op
# whose kernel reads an input on the host but is missing here only makes the check stricter
HOST_INPUTS = {"Reshape": {1}, "Expand": {1}, "ConstantOfShape": {0}, "Range": {0, 1, 2},
               "Slice": {1, 2, 3, 4}, "Squeeze": {1}, "Unsqueeze": {1}, "Pad": {1, 2}}  # fmt: skip


def host_values_on_device(model: onnx.ModelProto) -> list[str]:
    """Device inputs fed a value computed on the host, the way onnxruntime's CUDA provider
    places nodes (GetCpuPreferredNodes): Shape's output is on the host, and so is the output of
    any node that reads only host values, small initializers and graph inputs. Each such value
    read as a device input is a copy the provider inserts, and a graph with a copy cannot be
    captured as a CUDA graph."""
    small = {t.name for t in model.graph.initializer if np.prod(t.dims) <= 100}
    small |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    inputs = {i.name for i in model.graph.input}
    host: set[str] = set()
    found = []
    for node in model.graph.node:  # topological order
        if node.op_type in ("Shape", "Size"):
            host.update(node.output)
            continue
        safe = HOST_INPUTS.get(node.op_type, set())
        reads = [(k, i) for k, i in enumerate(node.input) if i in host]
        # on the host: a node that reads host values, none where its kernel reads the host
        # anyway, and otherwise only small initializers and graph inputs
        if (
            reads
            and all(k not in safe for k, _ in reads)
            and all(not i or i in host or i in small or i in inputs for i in node.input)
        ):
            host.update(node.output)
            continue
        found += [f"{node.op_type}[{k}] <- {i}" for k, i in reads if k not in safe]
    return found


def test_host_value_check_finds_a_copy() -> None:
    """The check itself: a host scalar expanded into a device tensor (torch.full of a shape) is
    reported; the same value as Expand's shape input is not."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t"])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),  # on the host
        helper.make_node("Expand", ["sf", "s"], ["full"]),  # sf as data: a copy
        helper.make_node("Add", ["x", "full"], ["y"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    assert host_values_on_device(model) == ["Expand[0] <- sf"]


def test_code2wav_can_be_captured_on_the_gpu(omni_ckpt, tmp_path, exports) -> None:
    """A cuda build's code2wav feeds no host-computed value to the device, so onnxruntime's
    CUDA provider inserts no copies and captures it as a CUDA graph (tests/test_gpu.py runs the
    capture on a GPU). Its first version fed two: the window's query lengths (torch.full of a
    shape) and, in every attention layer, a bound taken from a shape."""
    from edgeomni.export.family import BuildArgs

    # the export is test_omni_text_to_speech's (export_store.py): the lowering is checked
    exports.build(omni_ckpt, tmp_path / "eng", BuildArgs(2, 64, 128, device="cuda"), ["code2wav"])
    model = onnx.load(
        str(tmp_path / "eng" / "code2wav" / "code2wav.onnx"), load_external_data=False
    )
    assert host_values_on_device(model) == []


@pytest.mark.parametrize("model", ["qwen3", "omni"])
def test_right_padded_prefill_equals_row_by_row(qwen3_ckpt, omni_ckpt, tmp_path, mp, exports,
                                                model):  # fmt: skip
    """GroupQueryAttention without per-row query lengths (what onnxruntime-gpu 1.31 has): one
    right-padded prefill from an empty cache gives each row's logits, and leaves a cache the
    next decode step reads, as prefilling each row alone does: the LLM runner and the talker
    prefill a cohort so (tests/test_gpu.py checks the CUDA provider's kernel the same way)."""
    import prefill_check

    if model == "qwen3":
        eng = gpu_build_on_cpu(qwen3_ckpt, tmp_path / "eng", mp, exports, gqa=True)
        folders = [eng]
    else:
        eng = gpu_build_on_cpu(omni_ckpt, tmp_path / "eng", mp, exports, ["llm", "talker"],
                               gqa=True)  # fmt: skip
        folders = [eng, eng / "talker"]
    for folder in folders:
        assert (
            json.loads((folder / "config.json").read_text())["lowering"]["gqa_query_seqlens"]
            is False
        )
        batched, rowwise = prefill_check.batched_and_rowwise(folder)
        np.testing.assert_allclose(batched, rowwise, rtol=1e-4, atol=1e-4)
