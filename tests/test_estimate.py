"""edge-build --estimate: from config.json alone, each component's memory, checked against what
builds of the same checkpoints hold (their ONNX initializers and host tables)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgeomni.builder import cli as build_cli
from edgeomni.builder import estimate
from edgeomni.export.common.checkpoint import open_checkpoint
from edgeomni.export.family import BuildArgs
from edgeomni.export.registry import family_for


def built_bytes(engine_dir: Path, subdir: str, engine: str) -> tuple[int, int]:
    """(initializer bytes of the engine, tensor bytes of its host tables) as built."""
    from safetensors import safe_open

    model = onnx.load(str(engine_dir / subdir / engine), load_external_data=True)
    weights = 0
    shapes = (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
    for t in model.graph.initializer:
        if t.data_type in shapes and int(np.prod(t.dims)) < 64:
            continue  # a shape, axes or split constant of the graph, not a weight (a frame
            # engine repeats them at each of its 15 steps: 2 KB of a tiny code predictor)
        if t.data_type == onnx.TensorProto.INT4:
            weights += (int(np.prod(t.dims)) + 1) // 2
        else:
            weights += onnx.numpy_helper.to_array(t).nbytes
    tables = 0
    for f in (engine_dir / subdir).glob("*.safetensors"):
        with safe_open(str(f), "np") as h:
            tables += sum(h.get_tensor(k).nbytes for k in h.keys())  # noqa: SIM118 - not iterable
    return weights, tables


def config_only(ckpt: Path, tmp_path: Path) -> Path:
    """The checkpoint's config files without a single weight: what --estimate needs."""
    out = tmp_path / "config-only"
    for f in ckpt.rglob("*.json"):
        dst = out / f.relative_to(ckpt)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst)
    return out


def compare(ckpt: Path, engine_dir: Path, args: BuildArgs, tmp_path: Path) -> dict[str, tuple]:
    """component -> (estimated engine, built engine, estimated tables, built tables)."""
    meta = open_checkpoint(config_only(ckpt, tmp_path))
    hooks = family_for(meta.model_type).hooks()
    comps = {c.name: c for c in hooks.components(open_checkpoint(ckpt))
             if (engine_dir / c.subdir / c.engine).is_file()}  # fmt: skip
    rows = estimate.estimate(meta, hooks, list(comps.values()), args)
    out = {}
    for r in rows:
        c = comps[r.component]
        weights, tables = built_bytes(engine_dir, c.subdir, c.engine)
        out[r.component] = (r.engine_bytes, weights, r.table_bytes, tables)
    return out


def assert_close(rows: dict[str, tuple], names: list[str], rel: float = 0.01) -> None:
    for name in names:
        est, built, est_tables, tables = rows[name]
        assert abs(est / built - 1) < rel, (name, est, built)
        assert est_tables == tables, (name, est_tables, tables)


def test_qwen3_estimate_matches_the_build(qwen3_engine: Path, qwen3_ckpt: Path, tmp_path) -> None:
    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=128)
    assert_close(compare(qwen3_ckpt, qwen3_engine, args, tmp_path), ["llm"])


def test_omni_estimate_matches_the_build(omni_engine: Path, omni_ckpt: Path, tmp_path) -> None:
    """Every Qwen3-Omni component, encoders and code2wav (both engines) included, from
    config.json alone."""
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)
    rows = compare(omni_ckpt, omni_engine, args, tmp_path)
    assert set(rows) == {"llm", "audio", "visual", "talker", "code_predictor", "code2wav",
                         "code2wav_stream"}  # fmt: skip
    assert_close(rows, list(rows))


def test_asr_estimate_matches_the_build(asr_engine: Path, asr_ckpt: Path, tmp_path) -> None:
    """The llm and the audio encoder with its projector, from the config files alone."""
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)
    rows = compare(asr_ckpt, asr_engine, args, tmp_path)
    assert set(rows) == {"llm", "audio"}
    assert_close(rows, list(rows))


def test_tts_estimate_matches_the_build(tts_engine: Path, tmp_path) -> None:
    """The talker, the code predictor and code2wav (both engines), code2wav's codebooks
    counted as the one table each that the build folds its sum and usage counts into."""
    ckpt = tts_engine.parent / "ckpt"
    args = BuildArgs(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)
    rows = compare(ckpt, tts_engine, args, tmp_path)
    assert set(rows) == {"talker", "code_predictor", "code2wav", "code2wav_stream"}
    assert_close(rows, list(rows))


def test_tts_clone_encoders_estimate_matches_the_build(exports, tmp_path) -> None:
    """A Base checkpoint's clone encoders; the speech-tokenizer encoder's codebooks counted as
    the tables its nearest-entry search reads, which the build folds them into."""
    from edgeomni.export.tiny_tts import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "ckpt", "base", "tiny")
    args = BuildArgs(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)
    engine = tmp_path / "eng"
    exports.build(ckpt, engine, args, ["speaker_encoder", "speech_tokenizer_encoder"])
    rows = compare(ckpt, engine, args, tmp_path)
    assert set(rows) == {"speaker_encoder", "speech_tokenizer_encoder"}
    assert_close(rows, list(rows))


def test_int4_estimate_matches_the_build(omni_ckpt: Path, exports, tmp_path) -> None:
    """The estimate counts the int4 layers as the pass packs them, MoE experts included."""
    args = BuildArgs(max_batch_size=2, max_input_len=128, max_kv_cache_capacity=256,
                     quantization="int4_rtn", group_size=32)  # fmt: skip
    engine = tmp_path / "int4"
    assert exports.build(omni_ckpt, engine, args, ["llm", "talker", "code_predictor"]) is not None
    rows = compare(omni_ckpt, engine, args, tmp_path)
    assert_close(rows, ["llm", "talker", "code_predictor"])


def test_kv_cache_and_totals(qwen3_ckpt: Path) -> None:
    ckpt = open_checkpoint(qwen3_ckpt)
    hooks = family_for(ckpt.model_type).hooks()
    cfg = json.loads((qwen3_ckpt / "config.json").read_text())
    args = BuildArgs(max_batch_size=4, max_input_len=64, max_kv_cache_capacity=512)
    (row,) = estimate.estimate(ckpt, hooks, hooks.components(ckpt), args)
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4 * 512 * 4
    assert row.kv_bytes == kv
    assert row.total == row.engine_bytes + row.table_bytes + row.kv_bytes
    half = estimate.estimate(ckpt, hooks, hooks.components(ckpt),
                             BuildArgs(4, 64, 512, dtype="float16"))  # fmt: skip
    assert half[0].kv_bytes == kv // 2


def test_cli_prints_the_table_and_builds_nothing(qwen3_ckpt: Path, tmp_path, capsys) -> None:
    code = build_cli.main(["--model-dir", str(config_only(qwen3_ckpt, tmp_path)), "--estimate",
                           "--quantization", "int4_rtn", "--max-batch-size", "2"])  # fmt: skip
    assert code == build_cli.EXIT_OK
    out = capsys.readouterr().out
    assert "int4_rtn group 32 (lm_head int4)" in out and "2 x 4096 slots" in out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert len(lines["llm"]) == 4 and lines["llm"] == lines["total"]
    assert "Jetson Orin Nano 8 GB yes" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--estimate", "--graph-only"], "exclude each other"),
        ([], "--engine-dir is required"),
    ],
)
def test_cli_refuses(qwen3_ckpt: Path, capsys, argv: list[str], message: str) -> None:
    assert build_cli.main(["--model-dir", str(qwen3_ckpt), *argv]) == build_cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_readme_estimate_below_the_default_prompt_length(qwen3_ckpt: Path, capsys) -> None:
    """The README's --estimate line with a cache under 1024 slots: --max-input-len, not given,
    defaults to the capacity instead of refusing a flag the user never wrote."""
    code = build_cli.main(["--model-dir", str(qwen3_ckpt), "--estimate",
                           "--max-kv-cache-capacity", "512"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == build_cli.EXIT_OK, captured.err
    assert "4 x 512 slots" in captured.out
    given = build_cli.main(["--model-dir", str(qwen3_ckpt), "--estimate", "--max-input-len",
                            "1024", "--max-kv-cache-capacity", "512"])  # fmt: skip
    assert given == build_cli.EXIT_BAD_INPUT
    assert "--max-input-len 1024 exceeds --max-kv-cache-capacity 512" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fixture", "component", "key", "value", "message"),
    [
        ("qwen3_ckpt", "all", "num_hidden_layers", -2,
         "config.json: num_hidden_layers must be an integer >= 1, got -2"),
        ("qwen3_ckpt", "all", "num_attention_heads", 0,
         "config.json: num_attention_heads must be an integer >= 1, got 0"),
        ("qwen3_ckpt", "all", "hidden_size", "wide",
         "config.json: hidden_size must be an integer >= 1, got 'wide'"),
        ("qwen3_ckpt", "all", "num_key_value_heads", 0,
         "config.json: num_key_value_heads must be an integer >= 1, got 0"),
        ("qwen3_ckpt", "all", "rms_norm_eps", "tiny",
         "config.json: rms_norm_eps must be a number > 0, got 'tiny'"),
        ("qwen3_ckpt", "all", "vocab_size", 1.5, "config.json: vocab_size must be an integer >= 1"),
        ("omni_ckpt", "llm", "thinker_config.text_config.num_hidden_layers", -1,
         "config.json: thinker_config.text_config.num_hidden_layers must be an integer >= 1"),
        ("omni_ckpt", "talker", "talker_config.text_config.head_dim", "x",
         "config.json: talker_config.text_config.head_dim must be an integer >= 1, got 'x'"),
        ("omni_ckpt", "code_predictor", "talker_config.code_predictor_config.num_hidden_layers",
         0, "config.json: talker_config.code_predictor_config.num_hidden_layers must be an "
         "integer >= 1, got 0"),
        ("omni_ckpt", "code_predictor", "talker_config.code_predictor_config.vocab_size", None,
         "config.json: talker_config.code_predictor_config.vocab_size is missing"),
        # the encoders' sections go to transformers' config classes, which name the field
        ("omni_ckpt", "all", "thinker_config.audio_config.num_mel_bins", "many",
         "config.json: StrictDataclassFieldValidationError: Validation error for field "
         "'num_mel_bins'"),
    ],
)
def test_each_config_value_is_checked_by_name(
    request, tmp_path, capsys, fixture: str, component: str, key: str, value: object,
    message: str,
) -> None:  # fmt: skip
    """A bad config.json value is exit 2 naming its key, not an internal error or a negative
    total that fits every device."""
    ckpt = config_only(request.getfixturevalue(fixture), tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    *path, last = key.split(".")
    node = cfg
    for part in path:
        node = node[part]
    node[last] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()  # what making the session's checkpoint printed
    code = build_cli.main(["--model-dir", str(ckpt), "--estimate", "--components", component])
    err = capsys.readouterr().err
    assert code == build_cli.EXIT_BAD_INPUT, err
    assert message in err and "internal error" not in err


def test_a_family_without_a_memory_plan_says_so(tmp_path) -> None:
    """tests/toy_family has no memory_plan hook: one line and exit 2, not a guess."""
    import os
    import subprocess
    import sys

    tests = Path(__file__).resolve().parent
    env = {**os.environ, "EDGEOMNI_FAMILIES": "toy_family",
           "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    ckpt = tmp_path / "toy"
    made = subprocess.run([sys.executable, "-m", "edgeomni.export.tiny", "edgeomni_toy", str(ckpt)],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr
    code = "import sys; from edgeomni.builder.cli import main; sys.exit(main(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, "--model-dir", str(ckpt), "--estimate"],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == build_cli.EXIT_BAD_INPUT
    assert "the edgeomni_toy family gives no memory plan yet" in run.stderr


def test_dump_profile_reports_the_built_memory(omni_engine: Path, omni_ckpt: Path, capsys) -> None:
    """edge-infer --dump-profile's memory section: every built component's files as they lie,
    and a KV cache equal to the estimate's for the decoders that record their limits."""
    from edgeomni.runtime import cli
    from edgeomni.runtime.footprint import footprint

    ckpt = open_checkpoint(omni_ckpt)
    hooks = family_for(ckpt.model_type).hooks()
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)
    rows = {r.component: r for r in estimate.estimate(ckpt, hooks, hooks.components(ckpt), args)}
    built = footprint(omni_engine)
    folders = {c.subdir: c for c in hooks.components(ckpt)}
    assert set(built) == set(folders)
    for folder, b in built.items():
        c = folders[folder]
        engine_file = omni_engine / c.subdir / c.engine
        assert b["engine_bytes"] >= engine_file.stat().st_size > 0
        if b["kv_cache_bytes"] is not None:
            assert b["kv_cache_bytes"] == rows[c.name].kv_bytes, c.name
    assert built["."]["kv_cache_bytes"] is not None  # the thinker records its limits
    code = cli.main(["--config", str(omni_engine), "--prompt", "Hi", "--max-generate-length", "2",
                     "--dump-profile", "--sampling", '{"top_k": 1}'])  # fmt: skip
    assert code == cli.EXIT_OK
    err = capsys.readouterr().err
    profile = json.loads(err[err.index('{\n  "wall_ms"') :])  # the profile, after any log
    assert profile["memory"] == built


def test_int4_encoders_estimate_matches_the_build(omni_ckpt: Path, exports, tmp_path) -> None:
    """--quantize-encoders: the audio and vision encoders' linear layers int4 too (rounded
    plainly), counted by the estimate as built; an audio and image request still runs."""
    from edgeomni.runtime import cli

    args = BuildArgs(max_batch_size=2, max_input_len=128, max_kv_cache_capacity=256,
                     quantization="int4_awq", quantize_encoders=True)  # fmt: skip
    engine = tmp_path / "int4"
    assert exports.build(omni_ckpt, engine, args, ["llm", "audio", "visual"]) is not None
    for name in ("audio", "visual"):
        q = json.loads((engine / name / "config.json").read_text())["quantization"]
        assert q["method"] == "int4_rtn" and q["weights"] > 0, q
        assert q["awq"] == {"calibrated": False, "why": "encoders are rounded plainly"}
        built = json.loads((engine / name / "config.json").read_text())["engine"]
        ops = [n.op_type for n in onnx.load(str(engine / name / built)).graph.node]
        assert ops.count("MatMulNBits") == q["weights"]
    rows = compare(omni_ckpt, engine, args, tmp_path)
    assert_close(rows, ["llm", "audio", "visual"], rel=0.02)
    import soundfile as sf
    from PIL import Image

    rng = np.random.default_rng(0)
    sf.write(tmp_path / "a.wav", (0.1 * rng.standard_normal(16000)).astype(np.float32), 16000)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "i.png")
    code = cli.main(["--config", str(engine), "--prompt", "What is this?", "--audio",
                     str(tmp_path / "a.wav"), "--image", str(tmp_path / "i.png"),
                     "--max-generate-length", "4"])  # fmt: skip
    assert code == cli.EXIT_OK


@pytest.mark.parametrize("quantization", [None, "int4_rtn"])
def test_qwen35_estimate_matches_the_build(qwen35_ckpt: Path, exports, tmp_path,
                                           quantization: str | None) -> None:  # fmt: skip
    """Qwen3.5 (DeltaNet and attention layers): the engine's weights and the tables as built,
    and the state the runtime allocates (each DeltaNet layer's conv and recurrent rows, each
    attention layer's KV) equal to the estimate's and the footprint's; the total within 2%."""
    from edgeomni.runtime.footprint import footprint
    from edgeomni.runtime.pipeline import Pipeline

    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=128,
                     quantization=quantization, group_size=32)  # fmt: skip
    engine = tmp_path / "eng"
    assert exports.build(qwen35_ckpt, engine, args) is not None
    rows = compare(qwen35_ckpt, engine, args, tmp_path)
    assert_close(rows, ["llm"])
    ckpt = open_checkpoint(qwen35_ckpt)
    hooks = family_for(ckpt.model_type).hooks()
    (row,) = estimate.estimate(ckpt, hooks, hooks.components(ckpt), args)
    runner = Pipeline(engine).runner("llm")
    assert row.kv_bytes == runner.state.nbytes() == footprint(engine)["."]["kv_cache_bytes"]
    kinds = {t.kind for t in runner.state.tensors}
    assert kinds == {"kv", "conv", "recurrent"}
    _, weights, _, tables = rows["llm"]
    built = weights + tables + runner.state.nbytes()
    assert abs(row.total / built - 1) < 0.02, (row.total, built)
