"""edge-build: clear errors for bad input, and a failed build never damages a previous one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from export_store import ExportStore

from edgeomni.builder import cli, manifest
from edgeomni.builder.build import GRAPH_FILE, build
from edgeomni.builder.errors import BuildError
from edgeomni.export.family import BuildArgs

ARGS = BuildArgs(max_batch_size=2, max_input_len=32, max_kv_cache_capacity=64)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def copy_ckpt(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "no such checkpoint directory"),
        (lambda d: d.mkdir(), "no config.json"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{oops")), "not valid JSON"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{}")), "no model_type"),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "llama9"}')),
            "'llama9' is not supported; supported: qwen3, qwen3_5, qwen3_5_text, qwen3_asr, qwen3_omni_moe, qwen3_tts, qwen3_vl",
        ),
        (
            lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "qwen3"}')),
            "no *.safetensors",
        ),
    ],
)
def test_bad_checkpoints_are_named(tmp_path: Path, capsys, setup, message: str) -> None:
    ckpt = tmp_path / "ckpt"
    setup(ckpt)
    code, err = run_cli(capsys, "--model-dir", str(ckpt), "--engine-dir", str(tmp_path / "eng"))
    assert code == cli.EXIT_BAD_INPUT
    assert message in err
    assert not (tmp_path / "eng").exists()


def test_checkpoint_missing_a_weight(qwen3_ckpt: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    ckpt = copy_ckpt(qwen3_ckpt, tmp_path / "ckpt")
    weights = load_file(ckpt / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, ckpt / "model.safetensors")
    with pytest.raises(Exception, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        build(ckpt, tmp_path / "eng", ARGS)


def test_engine_dir_with_other_files_is_refused(qwen3_ckpt: Path, tmp_path: Path, capsys) -> None:
    eng = tmp_path / "eng"
    eng.mkdir()
    (eng / "thesis.txt").write_text("precious")
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert "holds files edge-build did not write: thesis.txt; move them out" in err
    assert (eng / "thesis.txt").read_text() == "precious"


@pytest.mark.parametrize("flag", ["--max-batch-size", "--max-input-len", "--max-kv-cache-capacity"])
def test_limits_must_be_positive(qwen3_ckpt: Path, tmp_path: Path, capsys, flag: str) -> None:
    code, err = run_cli(
        capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(tmp_path / "e"), flag, "0"
    )
    assert code == cli.EXIT_BAD_INPUT
    assert flag in err


def test_logits_topk_must_not_be_negative(qwen3_ckpt: Path, tmp_path: Path, capsys) -> None:
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir",
                        str(tmp_path / "e"), "--logits-topk", "-1")  # fmt: skip
    assert code == cli.EXIT_BAD_INPUT
    assert "--logits-topk must be >= 0" in err and not (tmp_path / "e").exists()


@pytest.mark.parametrize("flags, says", [
    (("--device", "cuda"), "is built for --backend onnxruntime --device cpu"),
    (("--quantization", "int4_awq"), "int4_awq calibrates the code predictor's steps engine"),
])  # fmt: skip
def test_a_frame_code_predictor_is_refused_where_it_cannot_be_built(
    qwen3_ckpt: Path, tmp_path: Path, capsys, flags: tuple[str, ...], says: str
) -> None:
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir",
                        str(tmp_path / "e"), "--code-predictor-calls", "frame", *flags)  # fmt: skip
    assert code == cli.EXIT_BAD_INPUT
    assert says in err and not (tmp_path / "e").exists()


def test_the_code_predictor_calls_default_by_target() -> None:
    """frame for ONNX Runtime on the CPU; steps on a GPU, with a sampler asked for, and for
    int4_awq (which calibrates the steps)."""
    from edgeomni.export.family import BuildArgs

    assert BuildArgs(1, 8, 16).code_predictor_calls == "frame"
    assert BuildArgs(1, 8, 16, quantization="int4_rtn").code_predictor_calls == "frame"
    for kw in ({"device": "cuda"}, {"engine_sampling": True}, {"quantization": "int4_awq"},
               {"backend": "tensorrt", "device": "cuda"}):  # fmt: skip
        assert BuildArgs(1, 8, 16, **kw).code_predictor_calls == "steps", kw  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ONNX Runtime on the CPU"):
        BuildArgs(1, 8, 16, device="cuda", code_predictor_calls="frame")


def test_unknown_component(qwen3_ckpt: Path, tmp_path: Path, capsys) -> None:
    code, err = run_cli(
        capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(tmp_path / "e"),
        "--components", "talker",
    )  # fmt: skip
    assert code == cli.EXIT_BAD_INPUT
    assert "unknown talker; this checkpoint has llm" in err


def test_failed_rebuild_keeps_previous_build(
    qwen3_ckpt: Path, qwen3_engine: Path, tmp_path: Path, monkeypatch, exports: ExportStore
) -> None:
    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    before = {p.name: p.read_bytes() for p in eng.iterdir()}

    from edgeomni.export.families.qwen3.build import HOOKS as qwen3

    def boom(*args, **kwargs):
        raise BuildError("simulated failure half way")

    monkeypatch.setattr(qwen3, "write_artifacts", boom)
    # the export is the session engine's (export_store.py): the step after it fails here
    with pytest.raises(BuildError, match="half way"), exports.reused():
        build(qwen3_ckpt, eng, ARGS)
    assert {p.name: p.read_bytes() for p in eng.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eng"]  # no workspace left


def test_built_engine_dir_layout(qwen3_engine: Path) -> None:
    names = {p.name for p in qwen3_engine.iterdir()}
    assert {
        GRAPH_FILE,
        "config.json",
        "llm.onnx",
        "embedding.safetensors",
        "tokenizer.json",
    } <= names
    assert "chat_template.jinja" in names
    files = manifest.read(qwen3_engine)  # every file the build wrote, each small enough to hash
    assert files is not None and set(files) == names - {manifest.MANIFEST}
    assert all(set(entry) == {"size", "sha256"} for entry in files.values())
    graph = json.loads((qwen3_engine / GRAPH_FILE).read_text())
    assert graph["terminals"] == ["llm:text"]
    (stage,) = graph["stages"]
    assert (stage["id"], stage["runner"], stage["artifact"]) == ("llm", "llm.backbone", ".")
    assert (stage["max_batch"], stage["max_seq"]) == (3, 128)
    cfg = json.loads((qwen3_engine / "config.json").read_text())
    assert cfg["builder_config"] == {
        "max_batch_size": 3, "max_input_len": 64, "max_kv_cache_capacity": 128,
    }  # fmt: skip


def test_built_files_are_readable_by_others(qwen3_engine: Path) -> None:
    """safetensors writes its files 0600; the build leaves every file 0644, every folder 0755."""
    modes = {p.name: p.stat().st_mode & 0o777 for p in [qwen3_engine, *qwen3_engine.rglob("*")]}
    assert set(modes.values()) <= {0o644, 0o755} and modes["embedding.safetensors"] == 0o644


def test_engine_has_lowered_attention(qwen3_engine: Path) -> None:
    import onnx

    model = onnx.load(str(qwen3_engine / "llm.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("GroupQueryAttention") == 2  # one per layer
    assert all(n.domain != "edgeomni" for n in model.graph.node)
