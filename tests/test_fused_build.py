"""edge-build --backend fused where no GPU is: the build's layout and config, its refusals, and
the engine's order of operations (tests/fused_reference.py, each kernel as its numpy reference)
against the ONNX Runtime CPU engine of the same checkpoint: logits within float rounding, over a
ragged prefill and decode steps. The kernels themselves run in tests/test_fused_gpu.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeomni.builder.build import build
from edgeomni.builder.errors import BuildError
from edgeomni.export.family import BuildArgs
from edgeomni.runtime import cli

sys.path.insert(0, str(Path(__file__).parent))
from fused_reference import FusedReference  # noqa: E402


@pytest.fixture(scope="module")
def fused_engine(qwen3_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    eng = tmp_path_factory.mktemp("fused") / "eng"
    args = BuildArgs(3, 64, 128, backend="fused", device="cuda", dtype="float32")
    assert build(qwen3_ckpt, eng, args) is not None
    return eng


def test_build_writes_the_fused_layout(fused_engine: Path) -> None:
    cfg = json.loads((fused_engine / "config.json").read_text())
    assert cfg["backend"] == "fused" and cfg["engine"] == "llm.fused.safetensors"
    assert not (fused_engine / "llm.onnx").exists()
    spec = cfg["fused"]
    assert spec["dtype"] == "float32" and spec["logits_topk"] == 64  # 64: the cuda default
    manifest = json.loads((fused_engine / "edgeomni_manifest.json").read_text())
    assert "llm.fused.safetensors" in json.dumps(manifest)


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"device": "cpu"}, "use --device cuda"), ({"dtype": "bfloat16"}, "float16 or float32"),
     ({"quantization": "int4_awq"}, "int4_rtn only"),
     ({"quantization": "int4_rtn", "dtype": "float32"}, "add --dtype float16"),
     ({"quantization": "int4_rtn", "group_size": 16}, "group-size of 32, 64, 128")],
)  # fmt: skip
def test_bad_fused_builds_are_refused(qwen3_ckpt, tmp_path, changes, message) -> None:
    args = {"backend": "fused", "device": "cuda", "dtype": "float16", **changes}
    with pytest.raises(BuildError, match=message):
        build(qwen3_ckpt, tmp_path / "eng", BuildArgs(3, 64, 128, **args))
    assert not (tmp_path / "eng").exists()


NO_DRIVER = "this machine has no NVIDIA driver (libcuda.so.1 cannot be loaded)"


def lacking(monkeypatch: pytest.MonkeyPatch, driver: bool, cuda_python: bool) -> None:
    """This machine as one with or without an NVIDIA driver and cuda-python."""
    from edgeomni.plugins import backends

    monkeypatch.setattr(backends, "cuda_device_problem", lambda device=0: None if driver
                        else NO_DRIVER)  # fmt: skip
    monkeypatch.setattr(backends, "_has_module", lambda name: cuda_python)


def test_fused_cli_defaults_to_cuda_and_notes_what_this_machine_lacks(
    qwen3_ckpt, tmp_path, monkeypatch, capsys
) -> None:
    """A build for another machine is legitimate: exit 0, and one note naming all this one
    lacks to run it, the driver first."""
    from edgeomni.builder import cli as build_cli

    lacking(monkeypatch, driver=False, cuda_python=False)
    code = build_cli.main(["--model-dir", str(qwen3_ckpt), "--engine-dir", str(tmp_path / "e"),
                           "--backend", "fused", "--max-batch-size", "2", "--max-input-len",
                           "16", "--max-kv-cache-capacity", "32"])  # fmt: skip
    assert code == 0
    assert json.loads((tmp_path / "e" / "config.json").read_text())["device"] == "cuda"
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("edge-build: note:")]
    assert len(notes) == 1, notes
    assert notes[0].index("no NVIDIA driver") < notes[0].index("no cuda-python"), notes


@pytest.mark.parametrize(("driver", "cuda_python"), [(False, False), (True, False), (False, True)])
def test_a_fused_engine_is_refused_naming_all_the_machine_lacks_once(
    fused_engine, monkeypatch, capsys, driver, cuda_python
) -> None:
    """edge-infer names the driver and cuda-python in one error, in that order, not the
    module first and the driver only once it is installed."""
    lacking(monkeypatch, driver, cuda_python)
    code = cli.main(["--config", str(fused_engine), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_CONFIG and err.count("\n") == 1, err
    assert ("no NVIDIA driver" in err) != driver and ("no cuda-python" in err) != cuda_python
    if not (driver or cuda_python):
        assert err.index("no NVIDIA driver") < err.index("no cuda-python"), err


def test_the_fused_steps_equal_the_onnx_engine(fused_engine, qwen3_engine) -> None:
    """A ragged prefill (rows of 5 and 3 tokens, one row idle) and four decode steps: the
    reference of the fused engine's calls gives the ONNX Runtime CPU engine's logits."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.pipeline import Pipeline

    runner = Pipeline(qwen3_engine).runner("llm")
    ref = FusedReference(fused_engine)
    rows, capacity = 3, 32
    cache = ref.cache(rows, capacity)
    session = DecoderSession(runner.engine, runner.state, rows, {"logits": (runner.vocab_size,)})
    rng = np.random.default_rng(0)
    lens = np.array([5, 3, 0], np.int32)
    ids = rng.integers(3, runner.vocab_size, (rows, 5))
    past = np.zeros(rows, np.int32)
    for step in range(5):
        embeds = runner.embedding[ids].astype(np.float32)
        positions = text_positions(past, ids.shape[1], False)
        last = np.maximum(lens - 1, 0).astype(np.int64)
        want = np.asarray(session.run(embeds, positions, past, lens, last)["logits"], np.float64)
        got = ref.run(embeds, positions, past, lens, last, cache)
        live = lens > 0
        scale = np.abs(want[live]).max()
        assert np.abs(got["logits"][live] - want[live]).max() <= 1e-4 * scale, step
        values, indices = got["topk_values"], got["topk_indices"]
        assert (indices[live, 0] == want[live].argmax(-1)).all()
        assert (np.diff(values, axis=1) <= 0).all()
        past = past + lens
        ids = want.argmax(-1)[:, None] if step else got["logits"].argmax(-1)[:, None]
        lens = np.array([1, 1, 1 if step else 0], np.int32)


def test_a_decoder_the_plan_cannot_hold_is_built_with_onnx_runtime_saying_why(
        qwen35_ckpt: Path, exports, tmp_path: Path, monkeypatch) -> None:  # fmt: skip
    """Qwen3.5 builds fused (its Gated DeltaNet layers and gated attention ran on a GPU); a
    graph the plan cannot hold (here one the compiler is made to refuse) is the ONNX Runtime
    CUDA build instead, its config naming the reason."""
    from edgeomni.builder import fused_plan

    args = BuildArgs(3, 64, 128, backend="fused", device="cuda", dtype="float32")
    assert exports.build(qwen35_ckpt, tmp_path / "eng", args, ["llm"]) is not None
    cfg = json.loads((tmp_path / "eng" / "config.json").read_text())
    assert cfg["backend"] == "fused" and "fused_refused" not in cfg
    assert {"delta_rule", "attn_gate"} <= {s["op"] for s in cfg["fused"]["plan"]}

    def refuse(path: object) -> None:
        raise fused_plan.Unfused("node /x: an op the plan has no step for")

    monkeypatch.setattr(fused_plan, "compile_file", refuse)
    assert exports.build(qwen35_ckpt, tmp_path / "ort", args, ["llm"]) is not None
    cfg = json.loads((tmp_path / "ort" / "config.json").read_text())
    assert cfg["backend"] == "onnxruntime" and "lowering" in cfg
    assert cfg["fused_refused"] == "node /x: an op the plan has no step for"


def test_validate_config_names_what_a_fused_engine_needs(fused_engine, capsys) -> None:
    """Here (no GPU) the graph is read and the engine refused with its reason, not run."""
    code = cli.main(["--config", str(fused_engine), "--validate-config"])
    err = capsys.readouterr().err
    assert code != cli.EXIT_OK
    assert "fused" in err or "cuda" in err


def test_graph_only_and_the_footprint_find_the_fused_engine(fused_engine, qwen3_ckpt,
                                                            tmp_path) -> None:  # fmt: skip
    import shutil

    from edgeomni.builder.build import graph_only
    from edgeomni.runtime.footprint import footprint

    eng = tmp_path / "eng"
    shutil.copytree(fused_engine, eng)
    (eng / "multistage_config.json").unlink()
    assert graph_only(qwen3_ckpt, eng) == eng / "multistage_config.json"
    graph = json.loads((eng / "multistage_config.json").read_text())
    assert [s["id"] for s in graph["stages"]] == ["llm"]
    weights = (eng / "llm.fused.safetensors").stat().st_size
    assert footprint(eng)["."]["engine_bytes"] == weights
    assert footprint(eng)["."]["table_bytes"] == (eng / "embedding.safetensors").stat().st_size



@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_fused_io_is_the_onnx_builds(qwen3_ckpt, tmp_path, dtype) -> None:
    """The fused engine declares the ONNX cuda build's names, types and output shapes (what
    stages bind and feed), from its config alone: integer lengths stay integers."""
    fused = tmp_path / "fused"
    build(qwen3_ckpt, fused, BuildArgs(3, 64, 128, backend="fused", device="cuda", dtype=dtype))
    build(qwen3_ckpt, tmp_path / "ort", BuildArgs(3, 64, 128, device="cuda", dtype=dtype))
    _same_io(fused, tmp_path / "ort" / "llm.onnx")


def test_the_fused_code_predictors_io_is_the_onnx_samplers(tts_engine, tts_fused,
                                                           tmp_path) -> None:  # fmt: skip
    """With its in-engine sampler too: the draw's inputs after lm_head_index, its outputs after
    the top-K, of the ONNX cuda build's types."""
    ort = tmp_path / "ort"
    build(tts_engine.parent / "ckpt", ort, BuildArgs(2, 64, 128, device="cuda"),
          ["code_predictor"])  # fmt: skip
    _same_io(tts_fused / "code_predictor", ort / "code_predictor" / "llm.onnx")


def _same_io(fused: Path, onnx_path: Path) -> None:
    import onnx

    from edgeomni.runtime.fused_spec import FusedSpec, io_types, names

    types = {1: np.float32, 10: np.float16, 6: np.int32, 7: np.int64, 11: np.float64}
    model = onnx.load(str(onnx_path), load_external_data=False)
    spec = FusedSpec(json.loads((fused / "config.json").read_text())["fused"], "config.json")
    inputs, outputs = names(spec)
    # the stages' inputs (the lowering's own, gqa_*, its binding derives from the lengths)
    graph_inputs = [i for i in model.graph.input if not i.name.startswith("gqa_")]
    assert list(inputs) == [i.name for i in graph_inputs]
    assert list(outputs) == [o.name for o in model.graph.output]
    ins, outs, shapes = io_types(spec)
    for value, table in [*((i, ins) for i in graph_inputs),
                         *((o, outs) for o in model.graph.output)]:  # fmt: skip
        assert table[value.name] == np.dtype(types[value.type.tensor_type.elem_type]), value.name
    for o in model.graph.output:
        dims = [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim]
        ours = shapes[o.name]
        assert len(ours) == len(dims), o.name
        assert [a for a in ours if isinstance(a, int)] == [d for d in dims if isinstance(d, int)]


def test_the_engine_accepts_the_builds_weights_and_names_what_is_wrong(fused_engine) -> None:
    """What the engine checks before anything goes to the GPU: every tensor its plan names, of
    its shape and type, and nothing else (the compiler's layout and the engine's agree)."""
    from edgeomni.runtime import safetensors_np
    from edgeomni.runtime.engine import EngineError
    from edgeomni.runtime.fused_spec import FusedSpec

    cfg = json.loads((fused_engine / "config.json").read_text())
    path = fused_engine / cfg["engine"]
    tensors = safetensors_np.load(path)
    spec = FusedSpec(cfg["fused"], "config.json")
    spec.check_weights(path, tensors)
    with pytest.raises(EngineError, match="no tensor 'layers.1.down'"):
        spec.check_weights(path, {k: v for k, v in tensors.items() if k != "layers.1.down"})
    norm = next(s["norm"] for s in cfg["fused"]["plan"] if s["op"] == "linear" and s["norm"])
    bad = {**tensors, norm: tensors[norm].astype(np.float16)}
    with pytest.raises(EngineError, match=f"{norm} is"):
        spec.check_weights(path, bad)
    with pytest.raises(EngineError, match="does not use: stray"):
        spec.check_weights(path, {**tensors, "stray": tensors[norm]})
    plan = cfg["fused"]["plan"]
    at = next(i for i, s in enumerate(plan) if s["op"] == "qk_rope")
    swapped = plan[:at] + [plan[at + 1], plan[at]] + plan[at + 2 :]
    for bad_plan, message in (([], "must be a list of steps"), (swapped, "right after its qk_rope"),
                              ([*plan, {"op": "conv"}], "not a step of")):  # fmt: skip
        with pytest.raises(EngineError, match=message):
            FusedSpec({**cfg["fused"], "plan": bad_plan}, "config.json")


@pytest.fixture(scope="module")
def tts_fused(tts_engine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-TTS's talker and code predictor built for the fused backend (the code predictor
    with its in-engine sampler, a cuda build's default); no graph, as code2wav is not built."""
    fused = tmp_path_factory.mktemp("tts-fused") / "eng"
    args = BuildArgs(2, 64, 128, backend="fused", device="cuda", dtype="float32")
    build(tts_engine.parent / "ckpt", fused, args, ["talker", "code_predictor"])
    return fused


@pytest.fixture(scope="module")
def tts_cp_steps(tts_engine: Path, exports, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The code predictor built for ONNX Runtime's CPU as one call a step (the CPU's default is
    one call a frame), the engine the fused one's calls are compared with."""
    engine = tmp_path_factory.mktemp("tts-cp-steps") / "eng"
    args = BuildArgs(2, 64, 128, code_predictor_calls="steps")
    exports.build(tts_engine.parent / "ckpt", engine, args, ["code_predictor"])
    return engine


def test_the_tts_talker_and_code_predictor_layouts_equal_their_onnx_engines(
    tts_engine, tts_fused, tts_cp_steps
) -> None:
    """Qwen3-TTS's fused components: the talker (its normed last hidden state feeds the code
    predictor) and the code predictor (its input projection from the talker's width, one of 15
    heads a step) give the ONNX Runtime CPU engines' logits and hidden state, prefill and
    decode, through the reference of the fused engine's calls."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.engine import open_engine
    from edgeomni.runtime.row_state import RowState

    fused = tts_fused
    for comp, onnx_dir in (("talker", tts_engine), ("code_predictor", tts_cp_steps)):
        cfg = json.loads((onnx_dir / comp / "config.json").read_text())
        ref = FusedReference(fused / comp)
        spec = ref.spec
        assert spec["last_hidden_output"] == (comp == "talker")
        assert (spec["lm_heads"] > 1, bool(spec["input_size"])) == ((comp != "talker"),) * 2
        engine = open_engine(onnx_dir / comp, cfg)
        outputs = {"logits": (cfg["vocab_size"],)}
        if spec["last_hidden_output"]:
            outputs["last_hidden"] = (spec["hidden_size"],)
        rows, capacity = 2, 32
        session = DecoderSession(engine, RowState.for_engine(cfg, rows, engine, capacity), rows,
                                 outputs)  # fmt: skip
        cache = ref.cache(rows, capacity)
        rng = np.random.default_rng(0)
        width = spec["input_size"] or spec["hidden_size"]
        lens, past = np.array([4, 2], np.int32), np.zeros(rows, np.int32)
        for step in range(3):
            x = (rng.standard_normal((rows, int(lens.max()), width)) * 0.5).astype(np.float32)
            pos = text_positions(past, x.shape[1], False)
            last = np.maximum(lens - 1, 0).astype(np.int64)
            head = {"lm_head_index": np.array([step], np.int64)} if spec["lm_heads"] > 1 else {}
            want = session.run(x, pos, past, lens, last, **head)
            got = ref.run(x, pos, past, lens, last, cache, head=step)
            for name in outputs:
                w = np.asarray(want[name], np.float64)
                assert np.abs(got[name] - w).max() <= 1e-4 * np.abs(w).max(), (comp, name, step)
            past, lens = past + lens, np.ones(rows, np.int32)


def test_the_fused_code_predictors_draws_equal_the_onnx_samplers(tts_engine, tts_fused,
                                                                 tmp_path) -> None:  # fmt: skip
    """The fused code predictor's in-engine draw (its sampler tables and the draw after the
    top-K) gives the ONNX engine's sampler's ids and next embeddings, step by step: greedy and
    the code predictor's sampling, each step fed the embedding the step before drew."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.engine import open_engine
    from edgeomni.runtime.row_state import RowState

    onnx = tmp_path / "onnx"
    args = BuildArgs(2, 64, 128, dtype="float32", engine_sampling=True)
    build(tts_engine.parent / "ckpt", onnx, args, ["code_predictor"])
    cfg = json.loads((onnx / "code_predictor" / "config.json").read_text())
    ref = FusedReference(tts_fused / "code_predictor")
    spec = ref.spec
    assert spec["sampler"] and ref.w["sampler_tables"].shape[0] == spec["lm_heads"]
    engine = open_engine(onnx / "code_predictor", cfg)
    width = spec["input_size"]
    outputs = {"logits": (cfg["vocab_size"],), "sampled_ids": (), "sampled_embeds": (width,)}
    rows, capacity = 2, 32
    rng = np.random.default_rng(3)
    drawn = 0
    for temperature, top_k, top_p in ((1.0, 1, 1.0), (1.0, 50, 0.8), (0.7, 5, 1.0)):
        session = DecoderSession(engine, RowState.for_engine(cfg, rows, engine, capacity), rows,
                                 outputs)  # fmt: skip
        cache = ref.cache(rows, capacity)
        x = (rng.standard_normal((rows, 2, width)) * 0.5).astype(np.float32)
        past, lens = np.zeros(rows, np.int32), np.full(rows, 2, np.int32)
        for step in range(4):
            draw = {"uniform": rng.random(rows) if top_k > 1 else np.zeros(rows),
                    "temperature": temperature, "top_k": top_k, "top_p": top_p}  # fmt: skip
            feeds = {"lm_head_index": np.array([step], np.int64),
                     "sample_uniform": draw["uniform"],
                     "sample_temperature": np.array([temperature]),
                     "sample_top_k": np.array([top_k], np.int64),
                     "sample_top_p": np.array([top_p])}  # fmt: skip
            pos = text_positions(past, x.shape[1], False)
            last = (lens - 1).astype(np.int64)
            want = session.run(x, pos, past, lens, last, **feeds)
            got = ref.run(x, pos, past, lens, last, cache, head=step, draw=draw)
            np.testing.assert_array_equal(got["sampled_ids"], want["sampled_ids"])
            np.testing.assert_allclose(got["sampled_embeds"], want["sampled_embeds"], rtol=1e-6)
            drawn += int((got["sampled_ids"] >= 0).sum())
            # a copy: the session writes its next output where this one is
            x = np.array(want["sampled_embeds"], np.float32)[:, None, :]
            past, lens = past + lens, np.ones(rows, np.int32)
    assert drawn >= 20  # the K decided most rows


@pytest.fixture(scope="module")
def fused_int4(qwen3_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    eng = tmp_path_factory.mktemp("fused-int4") / "eng"
    args = BuildArgs(3, 64, 128, backend="fused", device="cuda", dtype="float16",
                     quantization="int4_rtn", group_size=32)  # fmt: skip
    assert build(qwen3_ckpt, eng, args) is not None
    return eng


def test_an_int4_fused_build_stores_codes_and_scales(fused_int4: Path) -> None:
    """Each layer's four matrices and the LM head as int4 codes (two a byte) and one float16
    scale a row and group of 32, as the int4 pass wrote them; norms, rotary tables stay as they
    were."""
    from edgeomni.runtime import safetensors_np

    cfg = json.loads((fused_int4 / "config.json").read_text())
    spec = cfg["fused"]
    assert spec["int4"] == {"group_size": 32} and spec["dtype"] == "float16"
    assert cfg["quantization"]["method"] == "int4_rtn"  # the one pass's report
    w = safetensors_np.load(fused_int4 / cfg["engine"])
    h = spec["hidden_size"]
    assert w["lm_head"].dtype == np.uint8 and w["lm_head"].shape == (spec["vocab_size"], h // 2)
    assert w["lm_head.scales"].dtype == np.float16
    assert w["lm_head.scales"].shape == (spec["vocab_size"], h // 32)
    assert w["layers.0.down"].shape == (h, spec["intermediate_size"] // 2)
    assert w["layers.0.input_norm"].dtype == np.float32


def test_int4_fused_code_predictor_keeps_its_stacked_heads_float(tts_engine, tmp_path) -> None:
    """The fused build quantizes in the build's one int4 pass: the code predictor's stacked
    heads (a Gather of the head, then a MatMul: no constant weight) stay float16, as in the ONNX
    Runtime build, and a matrix whose K the group does not divide stays float too."""
    from edgeomni.runtime import safetensors_np

    eng = tmp_path / "eng"
    args = BuildArgs(2, 64, 128, backend="fused", device="cuda", dtype="float16",
                     quantization="int4_rtn", group_size=32)  # fmt: skip
    build(tts_engine.parent / "ckpt", eng, args, ["code_predictor"])
    cfg = json.loads((eng / "code_predictor" / "config.json").read_text())
    assert cfg["backend"] == "fused" and cfg["fused"]["int4"] == {"group_size": 32}
    w = safetensors_np.load(eng / "code_predictor" / cfg["engine"])
    assert w["lm_head"].dtype == np.float16 and w["lm_head"].ndim == 3
    down = w["layers.0.down"]  # K = 32: int4; the qkv's K of 16 is not a group of 32
    assert down.dtype == np.uint8 and w["layers.0.down.scales"].dtype == np.float16
    assert w["layers.0.qkv"].dtype == np.float16 and "layers.0.qkv.scales" not in w
    float_weights = cfg["quantization"]["float_weights"]
    assert float_weights, cfg["quantization"]


def test_the_int4_fused_steps_match_the_int4_onnx_engine(fused_int4, qwen3_ckpt, qwen3_engine,
                                                         tmp_path) -> None:  # fmt: skip
    """The int4 fused build's calls (its reference, the codes dequantized) against ONNX
    Runtime's int4_rtn CPU build of the same checkpoint and group size, which rounds the
    weights alike (from float32 there, float16 here) and also rounds the activations to int8
    (its CPU kernels' accuracy level 4): the logits sit far closer to that build's than to the
    float build's, which a wrong nibble order, scale index or group would not."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.pipeline import Pipeline

    onnx_int4 = tmp_path / "ort"
    assert build(qwen3_ckpt, onnx_int4, BuildArgs(3, 64, 128, quantization="int4_rtn",
                                                 group_size=32)) is not None  # fmt: skip
    ref = FusedReference(fused_int4)
    rows = 2
    ids = np.random.default_rng(1).integers(3, ref.spec["vocab_size"], (rows, 6))
    lens, past = np.array([6, 4], np.int32), np.zeros(rows, np.int32)
    positions = text_positions(past, ids.shape[1], False)
    last = (lens - 1).astype(np.int64)

    def logits(engine_dir: Path) -> tuple[np.ndarray, np.ndarray]:
        runner = Pipeline(engine_dir).runner("llm")
        session = DecoderSession(runner.engine, runner.state, rows, {"logits": (runner.vocab_size,)})
        embeds = runner.embedding[ids].astype(np.float32)
        out = session.run(embeds, positions, past, lens, last)["logits"]
        return np.asarray(out, np.float64), embeds

    want, embeds = logits(onnx_int4)
    floats, _ = logits(qwen3_engine)
    got = ref.run(embeds, positions, past, lens, last, ref.cache(rows, 32))["logits"]
    scale = np.abs(want).max()
    err, off = np.abs(got - want).max() / scale, np.abs(got - floats).max() / scale
    print(f"int4 fused reference against int4 ONNX Runtime {err:.2e}, against float {off:.2e}")
    assert err <= 0.25 * off
    assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.fixture(scope="module")
def omni_fused(omni_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-Omni's thinker and talker built fused (float32)."""
    fused = tmp_path_factory.mktemp("omni-fused") / "eng"
    build(omni_ckpt, fused, BuildArgs(3, 128, 256, backend="fused", device="cuda",
                                      dtype="float32"), ["llm", "talker"])  # fmt: skip
    return fused


@pytest.mark.parametrize("part", [".", "talker"])
def test_the_omni_moe_plans_equal_the_onnx_engines(omni_fused, omni_engine, part) -> None:
    """Qwen3-Omni's thinker (MoE layers, MRoPE, DeepStack, the accept layer's hidden states)
    and talker (MoE layers with a gated shared expert, MRoPE, last_hidden) compile to fused
    plans: their references (each step's kernel reference) give the ONNX Runtime CPU engines'
    logits and extra outputs over a ragged prefill and a decode step."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.engine import open_engine
    from edgeomni.runtime.row_state import RowState

    cfg = json.loads((omni_fused / part / "config.json").read_text())
    assert cfg["backend"] == "fused"
    spec = cfg["fused"]
    ops = [s["op"] for s in spec["plan"]]
    assert ops.count("moe") == spec["num_layers"]
    ref = FusedReference(omni_fused / part)
    ort_cfg = json.loads((omni_engine / part / "config.json").read_text())
    engine = open_engine(omni_engine / part, ort_cfg)
    rows, capacity, h = 2, 32, spec["hidden_size"]
    extra = ("hidden_states",) if spec["hidden_output_layer"] is not None else ()
    outputs = {"logits": (spec["vocab_size"],), **{n: (h,) for n in extra}}
    if spec["last_hidden_output"]:
        outputs["last_hidden"] = (h,)
    session = DecoderSession(engine, RowState.for_engine(ort_cfg, rows, engine, capacity), rows,
                             outputs, per_position=extra)  # fmt: skip
    cache = ref.cache(rows, capacity)
    rng = np.random.default_rng(4)
    past, lens = np.zeros(rows, np.int32), np.array([6, 4], np.int32)
    for call in range(2):
        seq = int(lens.max())
        x = (rng.standard_normal((rows, seq, h)) * 0.5).astype(np.float32)
        deep = (rng.standard_normal((spec["deepstack_layers"], rows, seq, h))
                * 0.1).astype(np.float32)  # fmt: skip
        feeds = {"deepstack_embeds": deep} if spec["deepstack_layers"] else {}
        pos = text_positions(past, seq, True)
        pos[1] = pos[1] * 3 % 7  # the height and width axes differ from time
        last = np.maximum(lens - 1, 0).astype(np.int64)
        want = session.run(x, pos, past, lens, last, **feeds)
        got = ref.run(x, pos, past, lens, last, cache, deepstack=deep)
        for name in outputs:
            w = np.asarray(want[name], np.float64)
            g = got[name]
            if name == "hidden_states":  # the prefill's padding positions are not compared
                live = np.arange(seq)[None] < lens[:, None]
                w, g = w[live], g[live]
            assert np.abs(g - w).max() <= 1e-4 * np.abs(w).max(), (part, call, name)
        past, lens = past + lens, np.ones(rows, np.int32)


def test_the_int4_omni_moe_plan_matches_the_int4_onnx_engine(omni_ckpt, omni_engine, exports,
                                                             tmp_path) -> None:  # fmt: skip
    """Qwen3-Omni's thinker with int4 experts (edgeomni::QuantMoE) compiles to a fused plan that
    takes the experts' codes and float16 scales as the int4 pass wrote them; its reference (the
    codes dequantized) lands far closer to ONNX Runtime's int4_rtn CPU build (QMoE, the same
    codes) than to the float build, which a wrong nibble, scale index or expert stride would
    not."""
    from edgeomni.runtime import safetensors_np
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.engine import open_engine
    from edgeomni.runtime.row_state import RowState

    int4 = {"quantization": "int4_rtn", "group_size": 32}
    fused = exports.build(omni_ckpt, tmp_path / "fused", BuildArgs(
        3, 64, 128, backend="fused", device="cuda", dtype="float16", **int4), ["llm"])  # fmt: skip
    ort = exports.build(omni_ckpt, tmp_path / "ort", BuildArgs(3, 64, 128, **int4), ["llm"])
    assert fused is not None and ort is not None
    cfg = json.loads((tmp_path / "fused" / "config.json").read_text())
    assert cfg["backend"] == "fused", cfg.get("fused_refused")
    spec = cfg["fused"]
    w = safetensors_np.load(tmp_path / "fused" / cfg["engine"])
    experts, h = spec["plan"][[s["op"] for s in spec["plan"]].index("moe")], spec["hidden_size"]
    codes, scales = w[experts["fc1"]], w[experts["fc1"] + ".scales"]
    assert codes.dtype == np.uint8 and codes.shape[2] == h // 2 and scales.dtype == np.float16
    ref = FusedReference(tmp_path / "fused")
    rows, capacity = 2, 32
    rng = np.random.default_rng(4)
    past, lens = np.zeros(rows, np.int32), np.array([6, 4], np.int32)
    seq = int(lens.max())
    x = (rng.standard_normal((rows, seq, h)) * 0.5).astype(np.float32)
    deep = (rng.standard_normal((spec["deepstack_layers"], rows, seq, h)) * 0.1).astype(np.float32)
    pos = text_positions(past, seq, True)
    last = np.maximum(lens - 1, 0).astype(np.int64)

    def logits(folder: Path) -> np.ndarray:
        ort_cfg = json.loads((folder / "config.json").read_text())
        engine = open_engine(folder, ort_cfg)
        extra = ("hidden_states",) if spec["hidden_output_layer"] is not None else ()
        session = DecoderSession(engine, RowState.for_engine(ort_cfg, rows, engine, capacity),
                                 rows, {"logits": (spec["vocab_size"],), **{n: (h,) for n in extra}},
                                 per_position=extra)  # fmt: skip
        feeds = {"deepstack_embeds": deep} if spec["deepstack_layers"] else {}
        out = session.run(x, pos, past, lens, last, **feeds)
        return np.asarray(out["logits"], np.float64)

    want, floats = logits(tmp_path / "ort"), logits(omni_engine)
    got = ref.run(x, pos, past, lens, last, ref.cache(rows, capacity), deepstack=deep)["logits"]
    scale = np.abs(want).max()
    err, off = np.abs(got - want).max() / scale, np.abs(got - floats).max() / scale
    print(f"int4 omni fused reference against int4 ONNX Runtime {err:.2e}, against float {off:.2e}")
    assert err <= 0.25 * off
