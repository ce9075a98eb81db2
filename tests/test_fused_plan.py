"""builder/fused_plan.py: the launch plan compiled from an exported decoder graph computes what
the module the graph was exported from computes (each plan step run by its kernel's numpy
reference, tests/fused_reference.py), for every variant the export writes; and a graph holding
anything the kernels do not compute is refused, naming it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.builder.fused_plan import Unfused, compile_file

sys.path.insert(0, str(Path(__file__).parent))
from fused_reference import FusedReference  # noqa: E402

torch = pytest.importorskip("torch")

BASE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "vocab_size": 80, "rms_norm_eps": 1e-6, "rope_theta": 1e4}  # fmt: skip
VARIANTS = {
    "qwen3": {},
    "bias, no q/k norm": {"attention_bias": True, "qk_norm": False},
    "mrope, deepstack, hidden states": {"num_layers": 3, "mrope_section": (4, 2, 2),
                                        "deepstack_layers": 2, "hidden_output_layer": 1},
    "input projection, stacked heads, last hidden": {"input_size": 32, "lm_heads": 3,
                                                     "last_hidden_output": True},
    # Qwen3-Omni's thinker: every MLP an edgeomni::MoE of 6 experts, top 2 (renormalised)
    "moe": {"num_layers": 2, "moe": (6, 2, 40, True)},
    "moe, weights as routed": {"num_layers": 1, "moe": (5, 3, 24, False)},
    # Qwen3-Omni's talker: routed experts plus a shared expert scaled by sigmoid of its gate
    "moe with a gated shared expert": {"num_layers": 2, "moe": (5, 2, 24, False, 48)},
}  # fmt: skip


def module_of(fields: dict[str, Any], seed: int = 0) -> Any:
    from edgeomni.export.common.decoder import CausalLM, DecoderConfig
    from edgeomni.export.common.moe import TalkerSparseMoE, ThinkerSparseMoE

    torch.manual_seed(seed)
    fields = dict(fields)
    moe = fields.pop("moe", None)
    module = CausalLM(DecoderConfig(**{**BASE, **fields})).eval()
    if moe is not None:  # experts, top-k, intermediate, normalize[, shared intermediate]
        experts, top_k, inter, normalize, *shared = moe
        for layer in module.model.layers:
            layer.mlp = (TalkerSparseMoE(BASE["hidden_size"], inter, experts, top_k, normalize,
                                         *shared) if shared else  # fmt: skip
                         ThinkerSparseMoE(BASE["hidden_size"], inter, experts, top_k, normalize))
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.15) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return module


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_plan_computes_what_the_module_computes(variant: str, tmp_path: Path) -> None:
    """A ragged prefill (rows of 5 and 3 positions) and a decode step: the compiled plan's
    logits and extra outputs equal the float32 module's, with every field of the variant in the
    plan (MRoPE's axes and inv_freq read back from the graph's angles)."""
    from edgeomni.export.common.onnx_export import export_causal_lm

    fields = VARIANTS[variant]
    module = module_of(fields)
    cfg = module.cfg
    raw = export_causal_lm(module, tmp_path / "model.onnx")
    spec, tensors = compile_file(raw)
    ops = [s["op"] for s in spec["plan"]]
    assert ops.count("attention") == cfg.num_layers and ops.count("deepstack") == (
        cfg.deepstack_layers)  # fmt: skip
    assert spec["mrope"] == (cfg.mrope_section is not None)
    assert ops.count("moe") == (cfg.num_layers if "moe" in fields else 0)
    ref = FusedReference.of(spec, tensors)
    rng = np.random.default_rng(1)
    rows, seq, capacity = 2, 5, 16
    cache = ref.cache(rows, capacity)
    torch_cache = [torch.zeros(rows, cfg.num_kv_heads, capacity, cfg.head_dim)
                   for _ in range(2 * cfg.num_layers)]  # fmt: skip
    past, lens = np.zeros(rows, np.int32), np.array([5, 3], np.int32)
    for call in range(2):
        embeds = rng.standard_normal((rows, seq, cfg.embeds_size)).astype(np.float32)
        positions = past[:, None] + np.arange(seq)[None]
        if cfg.mrope_section is not None:  # three different axes: t, h, w
            positions = np.stack([positions, positions * 3 % 7, positions % 4])
        last = np.maximum(lens - 1, 0).astype(np.int64)
        args: list[Any] = [torch.tensor(embeds), torch.tensor(positions, dtype=torch.int64),
                           torch.tensor(past), torch.tensor(lens), torch.tensor(last)]  # fmt: skip
        extra: dict[str, Any] = {}
        head = 2 if cfg.lm_heads > 1 else 0
        if cfg.lm_heads > 1:
            args.append(torch.tensor([head]))
        deep = None
        if cfg.deepstack_layers:
            deep = rng.standard_normal((cfg.deepstack_layers, rows, seq, cfg.hidden_size))
            args.append(torch.tensor(deep, dtype=torch.float32))
            extra["deepstack"] = deep
        with torch.no_grad():
            outs = module(*args, *torch_cache)
        _, names = module.io_names()
        want = dict(zip(names, outs, strict=True))
        torch_cache = [want[n] for n in names if n.startswith("present_")]
        got = ref.run(embeds, positions, past, lens, last, cache, head=head, **extra)
        for name in ("logits", "hidden_states", "last_hidden"):
            if name in want:
                w = want[name].double().numpy()
                err = np.abs(got[name] - w).max() / np.abs(w).max()
                assert err < 1e-5, (variant, call, name, err)
        past, lens, seq = past + lens, np.ones(rows, np.int32), 1


def test_an_int4_talker_moe_plan_computes_what_onnx_runtime_computes(tmp_path: Path) -> None:
    """The int4 pass turns the talker's shared expert (torch's Gemms of 2-D rows) into
    QuantMatMuls of 2-D rows, split on axis 1 (a 3-D product's axis would be 2): the plan takes
    them, and its reference of the int4 codes gives ONNX Runtime's logits on the same graph
    (float16 rounding apart), far closer than the float module's."""
    import onnx
    import onnxruntime as ort

    from edgeomni.builder.quantize import Quantization, quantize_file
    from edgeomni.export.common.onnx_export import export_causal_lm
    from edgeomni.plugins import lower_model

    module = module_of({"num_layers": 2, "moe": (4, 2, 32, False, 64)}).half()  # int4: float16
    raw = export_causal_lm(module, tmp_path / "raw" / "model.onnx")
    int4 = tmp_path / "int4" / "model.onnx"
    int4.parent.mkdir()
    assert quantize_file(raw, int4, Quantization("int4_rtn", 32))
    spec, tensors = compile_file(int4)
    assert spec["int4"] == {"group_size": 32}, sorted(n for n in tensors if n.endswith(".scales"))
    assert all(n + ".scales" in tensors for n in ("layers.0.qkv", "layers.0.experts_gate_up"))
    graph = lower_model(onnx.load(str(int4)), "onnxruntime", base_dir=int4.parent)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    cfg, ref = module.cfg, FusedReference.of(spec, tensors)
    rng = np.random.default_rng(2)
    rows, seq, capacity = 2, 4, 8
    past, lens = np.zeros(rows, np.int32), np.array([4, 2], np.int32)
    embeds = rng.standard_normal((rows, seq, cfg.hidden_size)).astype(np.float16)
    positions = np.tile(np.arange(seq), (rows, 1))
    last = np.maximum(lens - 1, 0).astype(np.int64)
    feeds: dict[str, Any] = {"inputs_embeds": embeds, "position_ids": positions,
                             "past_lens": past, "query_lens": lens, "last_indices": last}  # fmt: skip
    shape = (rows, cfg.num_kv_heads, capacity, cfg.head_dim)
    feeds.update({i.name: np.zeros(shape, np.float16) for i in session.get_inputs()
                  if i.name.startswith(("past_key", "past_value"))})  # fmt: skip
    want = session.run(["logits"], feeds)[0]
    got = ref.run(embeds, positions, past, lens, last, ref.cache(rows, capacity))["logits"]
    with torch.no_grad():  # the float16 module's, before rounding to int4
        cache = [torch.zeros(shape, dtype=torch.float16) for _ in range(2 * cfg.num_layers)]
        float_logits = module(*(torch.tensor(feeds[n]) for n in list(feeds)[:5]), *cache)[0]
    err, int4_err = (float(np.abs(got - w).max() / np.abs(want).max())
                     for w in (want, float_logits.double().numpy()))  # fmt: skip
    assert err < 3e-3 and int4_err > 10 * err, (err, int4_err)  # float16 rounding apart


@pytest.fixture(scope="module")
def sampler_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A code predictor's decoder exported with its in-engine sampler (export/common/sampler.py)."""
    from edgeomni.export.common.onnx_export import export_causal_lm

    module = module_of({"input_size": 32, "lm_heads": 3})
    tables = torch.randn(3, BASE["vocab_size"], 32)
    return export_causal_lm(module, tmp_path_factory.mktemp("sampler") / "model.onnx",
                            sampler_tables=tables, logits_topk=16)  # fmt: skip


def test_a_sampler_region_is_proven_and_its_tables_taken(sampler_graph: Path) -> None:
    spec, tensors = compile_file(sampler_graph)
    assert spec["sampler"] and spec["plan"][-1] == {"op": "topk", "k": 16, "bias": None,
                                                    "tables": "sampler_tables"}  # fmt: skip
    assert tensors["sampler_tables"].shape == (3, BASE["vocab_size"], 32)


def mutated(src: Path, dst: Path, change: Any) -> Path:
    import onnx

    model = onnx.load(str(src))
    change(model.graph)
    onnx.save(model, str(dst))
    return dst


def node(graph: Any, op: str, feeding: str | None = None) -> Any:
    return next(n for n in graph.node if n.op_type == op and (feeding is None or feeding in n.input))


def test_a_sampler_that_draws_otherwise_is_refused(sampler_graph: Path, tmp_path: Path) -> None:
    """The temperature multiplying instead of dividing: the probes draw other ids."""
    def change(graph: Any) -> None:
        node(graph, "Div", "sample_temperature").op_type = "Mul"

    with pytest.raises(Unfused, match="draws other ids"):
        compile_file(mutated(sampler_graph, tmp_path / "m.onnx", change))


def test_rotary_angles_other_than_position_times_inv_freq_are_refused(sampler_graph: Path,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    """An angle of position squared times inv_freq is a function of position_ids alone, but not
    the kernels' rotary: refused, not run approximately."""
    from onnx import helper

    def change(graph: Any) -> None:
        mul = next(n for n in graph.node if n.op_type == "Mul"
                   and any("inv_freq" in i for i in n.input))  # fmt: skip
        square = helper.make_node("Mul", [mul.input[0], mul.input[0]], ["squared_positions"])
        mul.input[0] = "squared_positions"
        graph.node.insert(list(graph.node).index(mul), square)

    with pytest.raises(Unfused, match="not position \\* inv_freq"):
        compile_file(mutated(sampler_graph, tmp_path / "m.onnx", change))


def test_an_mlp_that_is_not_swiglu_is_refused_naming_the_node(sampler_graph: Path,
                                                              tmp_path: Path) -> None:  # fmt: skip
    def change(graph: Any) -> None:
        node(graph, "Sigmoid").op_type = "Tanh"

    with pytest.raises(Unfused, match="Tanh"):
        compile_file(mutated(sampler_graph, tmp_path / "m.onnx", change))


def test_a_stale_read_of_the_residual_stream_is_refused(sampler_graph: Path,
                                                        tmp_path: Path) -> None:  # fmt: skip
    """The plan updates h in place: a final norm of the first layer's residual (a value the
    graph still has, the plan no longer) is refused, not run on the updated stream."""
    def change(graph: Any) -> None:
        norms = [n for n in graph.node if n.op_type == "RMSNormalization"]
        first_residual = next(n for n in graph.node if n.op_type == "Add"
                              and any(m.input[0] == n.output[0] for m in norms))  # fmt: skip
        norms[-1].input[0] = first_residual.output[0]

    with pytest.raises(Unfused, match="before a later write"):
        compile_file(mutated(sampler_graph, tmp_path / "m.onnx", change))


@pytest.fixture(scope="module")
def qwen35_gated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A Qwen3.5 decoder of full-attention layers alone, exported: (module, its graph)."""
    from edgeomni.export.common.onnx_export import export_causal_lm
    from edgeomni.export.families.qwen3_5 import model as qm

    cfg = qm.Qwen35Config(
        hidden_size=64, layer_types=(qm.FULL, qm.FULL), num_heads=4, num_kv_heads=2,
        head_dim=16, intermediate_size=96, vocab_size=80, rms_norm_eps=1e-6, rope_theta=1e4,
        rotary_dim=8, mrope_section=(2, 1, 1), attention_bias=False, conv_kernel=4,
        linear_k_heads=2, linear_v_heads=4, linear_k_dim=8, linear_v_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    module = qm.Qwen35CausalLM(cfg).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.15) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return module, export_causal_lm(module, tmp_path_factory.mktemp("q35") / "model.onnx")


def test_qwen35_gated_attention_compiles_to_what_the_module_computes(qwen35_gated) -> None:
    """Qwen3.5's full-attention layers (its Gated DeltaNet layers left out: their steps are
    not in the plan yet): q beside its output gate in one product, rope on each head's first
    quarter (a Slice, the Rotary, a Concat), MRoPE, the output times sigmoid of the gate. The
    plan's reference equals the float32 module over a ragged prefill and a decode step."""
    module, graph = qwen35_gated
    spec, tensors = compile_file(graph)
    assert spec["attn_gate"] and spec["rotary_dim"] == 8 and spec["mrope"]
    assert [s["op"] for s in spec["plan"]].count("attn_gate") == 2
    _spec_declares_the_graphs_io(spec, tensors, graph, module)
    _plan_equals_qwen35(module, FusedReference.of(spec, tensors), [5, 3], calls=2, seed=3)


def _spec_declares_the_graphs_io(spec: dict[str, Any], tensors: dict[str, np.ndarray],
                                 graph: Path, module: Any) -> None:  # fmt: skip
    """The plan read back as the engine reads it (runtime/fused_spec.py) holds every weight it
    names, and declares the exported graph's inputs and outputs with their types, and the
    module's row state (names, shapes, types) in its order."""
    import onnx

    from edgeomni.runtime.fused_spec import FusedSpec, io_types, names, state_tensors

    read = FusedSpec(json.loads(json.dumps(spec)), "config.json")  # as config.json holds it
    read.check_weights(graph, tensors)
    assert state_tensors(read) == module.state_tensors()
    model = onnx.load(str(graph), load_external_data=False)
    elem = {1: "float32", 10: "float16", 6: "int32", 7: "int64"}
    want = [(v.name, elem[v.type.tensor_type.elem_type]) for v in model.graph.input]
    inputs, _ = names(read)
    types, out_types, _ = io_types(read)
    assert [(n, types[n].name) for n in inputs] == want
    outs = [(v.name, elem[v.type.tensor_type.elem_type]) for v in model.graph.output]
    assert [(n, out_types[n].name) for n in names(read)[1]] == outs


def _plan_equals_qwen35(module: Any, ref: FusedReference, lens: list[int], calls: int,
                        seed: int) -> None:  # fmt: skip
    """The plan's reference gives the float32 Qwen3.5 module's logits (MRoPE positions): a
    ragged prefill of ``lens``, then one-token decode calls, each side carrying its states."""
    rng = np.random.default_rng(seed)
    rows, seq, capacity = len(lens), max(lens), 16
    cache = ref.cache(rows, capacity)
    states = [torch.zeros(rows, *t.row_shape(capacity)) for t in module.state_tensors()]
    past, query = np.zeros(rows, np.int32), np.array(lens, np.int32)
    for call in range(calls):
        embeds = rng.standard_normal((rows, seq, module.cfg.hidden_size)).astype(np.float32)
        positions = past[:, None] + np.arange(seq)[None]
        positions = np.stack([positions, positions * 3 % 7, positions % 4])
        last = np.maximum(query - 1, 0).astype(np.int64)
        with torch.no_grad():
            outs = module(torch.tensor(embeds), torch.tensor(positions, dtype=torch.int64),
                          torch.tensor(past), torch.tensor(query), torch.tensor(last), *states)
        states = list(outs[1:])
        want = outs[0].double().numpy()
        got = ref.run(embeds, positions, past, query, last, cache)["logits"]
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5, call
        past, query, seq = past + query, np.ones(rows, np.int32), 1


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A Qwen3.5 decoder of Gated DeltaNet and gated attention layers, exported."""
    from edgeomni.export.common.onnx_export import export_causal_lm
    from edgeomni.export.families.qwen3_5 import model as qm

    cfg = qm.Qwen35Config(
        hidden_size=64, layer_types=(qm.LINEAR, qm.FULL, qm.LINEAR), num_heads=4,
        num_kv_heads=2, head_dim=16, intermediate_size=96, vocab_size=80, rms_norm_eps=1e-6,
        rope_theta=1e4, rotary_dim=8, mrope_section=(2, 1, 1), attention_bias=False,
        conv_kernel=4, linear_k_heads=2, linear_v_heads=4, linear_k_dim=8, linear_v_dim=16,
    )  # fmt: skip
    torch.manual_seed(1)
    module = qm.Qwen35CausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.normal_(0, 0.15) if p.dim() > 1 else p.uniform_(0.5, 1.5)
            if name.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)  # each head its own decay
    return module, export_causal_lm(module, tmp_path_factory.mktemp("q35d") / "model.onnx")


def test_qwen35_gated_deltanet_layers_compile_to_what_the_module_computes(qwen35) -> None:
    """A Gated DeltaNet layer is in_proj into mix, the conv of mix's first columns (its state
    in place), the rule with its two gates from mix's last columns (its state in place), the
    output's per-head norm times silu(z), out_proj: the plan's numpy reference equals the
    float32 module over a ragged prefill and two decode steps, states carried; its config reads
    back with the ONNX build's inputs, outputs and row state (the DeltaNet layers' too)."""
    module, graph = qwen35
    spec, tensors = compile_file(graph)
    ops = [s["op"] for s in spec["plan"]]
    assert spec["num_layers"] == 3 and ops.count("attention") == 1
    assert [ops.count(op) for op in ("delta_conv", "delta_rule", "gated_norm")] == [2, 2, 2]
    assert spec["delta"] == {"k_heads": 2, "v_heads": 4, "k_dim": 8, "v_dim": 16,
                             "conv_kernel": 4}  # fmt: skip
    rules = [s for s in spec["plan"] if s["op"] == "delta_rule"]
    assert [s["layer"] for s in rules] == [0, 2]
    assert {s["softplus_threshold"] for s in rules} == {20.0}  # torch's: x itself above it
    _spec_declares_the_graphs_io(spec, tensors, graph, module)
    _plan_equals_qwen35(module, FusedReference.of(spec, tensors), [6, 2, 4], calls=3, seed=5)


def test_a_deltanet_decay_of_another_form_is_refused(qwen35, tmp_path) -> None:
    """The decay's softplus without its bias (a graph that is not the layer's gate): refused,
    naming the node that breaks the match, not planned approximately."""
    def change(graph: Any) -> None:
        add = next(n for n in graph.node if n.op_type == "Add" and "dt_bias" in n.input[1])
        soft = next(n for n in graph.node if n.op_type == "Softplus")
        soft.input[0] = add.input[0]

    with pytest.raises(Unfused, match="Softplus"):
        compile_file(mutated(qwen35[1], tmp_path / "m.onnx", change))


def test_a_rotary_of_other_dims_than_a_heads_first_is_refused(qwen35_gated, tmp_path) -> None:
    """The rotated dims concatenated after the untouched ones (not what the kernels' partial
    rotary computes): refused, naming the Concat."""
    def change(graph: Any) -> None:
        concat = next(n for n in graph.node if n.op_type == "Concat" and any(
            m.op_type == "Slice" and m.output[0] in n.input for m in graph.node))  # fmt: skip
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]

    with pytest.raises(Unfused, match="Concat.*not a head's rotated first dims"):
        compile_file(mutated(qwen35_gated[1], tmp_path / "m.onnx", change))


def _kernel_params(source: str) -> dict[str, list[list[str]]]:
    """Each kernel's parameter kinds ("ptr", "i32", "i64", "f32", "f64") as the module's source
    declares them; kernels a macro defines (``NAME``: the linears) under that name, every such
    signature."""
    import re

    defines = dict(re.findall(r"#define (\w+) ((?:[^\n]*\\\n)*[^\n]*)", source))
    out: dict[str, list[list[str]]] = {}
    pattern = r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\(([^)]*)\)'
    for name, params in re.findall(pattern, source.replace("\\\n", " ")):
        for key, value in defines.items():
            params = re.sub(rf"\b{key}\b", value.replace("\\\n", " "), params)
        kinds = []
        for p in (p.strip() for p in params.split(",") if p.strip()):
            p = p.replace("__restrict__", "").replace("const ", "")
            kinds.append("ptr" if "*" in p else "i64" if p.startswith("long long") else
                         "f64" if p.startswith("double") else "f32" if p.startswith("float")
                         else "i32")  # fmt: skip
        out.setdefault(name, []).append(kinds)
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("graph", ["sampler", "qwen35"])
def test_every_launch_passes_what_its_kernel_declares(request, graph: str, dtype: str) -> None:
    """The fused engine's launches (runtime/fused_engine.py, runtime/fused_state_steps.py) for
    a plan's prefill and decode calls, against the kernels' C signatures in the module's
    source: as many arguments, each of the kind the parameter is. A kernel whose parameters
    change without its launch fails here on the CPU, not first on a GPU."""
    import ctypes
    from types import SimpleNamespace

    from edgeomni.plugins import decoder_cuda as dc
    from edgeomni.runtime import fused_engine as fe
    from edgeomni.runtime.fused_spec import FusedSpec, names

    path = request.getfixturevalue("sampler_graph") if graph == "sampler" else \
        request.getfixturevalue("qwen35")[1]  # fmt: skip
    table, tensors = compile_file(path)
    spec = FusedSpec({**json.loads(json.dumps(table)), "dtype": dtype,
                      "embeds_dtype": dtype if table["sampler"] else "float32"}, "config.json")
    params = _kernel_params(dc.Variant(dtype, dtype).source())
    kinds = {ctypes.c_void_p: "ptr", ctypes.c_int32: "i32", ctypes.c_int64: "i64",
             ctypes.c_float: "f32", ctypes.c_double: "f64"}
    launched: list[str] = []

    class Kernels:
        variant = dc.Variant(dtype, dtype)

        def launch(self, name: str, grid: Any, block: int, args: list[Any], **_: Any) -> None:
            got = [kinds[type(a)] for a in args]
            declared = params.get(name) or params["NAME"]  # the linears: a macro's signatures
            assert got in declared, (name, got, declared)
            launched.append(name)

    class Ptrs(dict):
        def __missing__(self, key: str) -> int:
            return 4096

    inputs, outputs = names(spec)
    engine = SimpleNamespace(
        spec=spec, kernels=Kernels(), cu_stream=0, overlap=True, int4=set(),
        attention=SimpleNamespace(launch=lambda *a, **k: None),
        attention_qk=SimpleNamespace(launch=lambda *a, **k: None),
        weights={n: SimpleNamespace(ptr=8192) for n in tensors})  # fmt: skip
    for seq in (3, 1):  # a prefill, then a decode call
        binding = SimpleNamespace(
            _engine=engine, ptrs=Ptrs(), batch=2, seq=seq, capacity=16,
            _arrays={n: SimpleNamespace(ptr=16384) for n in (*inputs, *outputs)},
            _copy=lambda *a: None)  # fmt: skip
        fe._Launches(binding).run(spec.plan)
    assert "linear" in " ".join(launched) and len(launched) > 10
    if graph == "qwen35":
        assert {"conv_state", "delta_rule", "gated_norm", "attn_gate", "qk_rope"} <= set(launched)
