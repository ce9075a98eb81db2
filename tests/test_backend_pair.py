"""bench/backend_pair.py: the two-backend mode of the pipeline benchmarks (bench/gpu_tts.py,
bench/gpu_omni.py), its byte counts for the HBM bound, and its ratio table."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

import backend_pair as bp  # noqa: E402


def write_header(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A safetensors file with these tensors' headers and zero bytes of data each."""
    header = {n: {"dtype": "F16", "shape": list(s), "data_offsets": [0, 0]} for n, s in shapes.items()}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_a_step_reads_dense_weights_once_and_the_experts_its_rows_route_to() -> None:
    shapes = {
        "m.model.layers.0.self_attn.q_proj.weight": (8, 4),  # 32
        "m.model.layers.0.mlp.experts.0.up_proj.weight": (2, 4),  # 8 an expert, 4 experts
        "m.model.layers.0.mlp.experts.1.up_proj.weight": (2, 4),
        "m.model.layers.0.mlp.experts.2.up_proj.weight": (2, 4),
        "m.model.layers.0.mlp.experts.3.up_proj.weight": (2, 4),
        "m.model.norm.weight": (4,),  # 4
        "m.model.embed_tokens.weight": (100, 4),  # a lookup: not read whole
        "m.lm_head.weight": (10, 4),  # 40, named as read
        "other.weight": (1000,),
    }
    one_row = bp.decoder_bytes(shapes, "m.", 2, 1, ("m.lm_head.weight",))
    assert one_row == (32 + 4 + 40 + 2 * 8) * 2  # top-2 of 4 experts at one row
    many = bp.decoder_bytes(shapes, "m.", 2, 64, ("m.lm_head.weight",))
    assert many == pytest.approx((32 + 4 + 40 + 4 * 8 * (1 - 0.5**64)) * 2)
    stacked = {"m.model.layers.0.mlp.experts.gate_up_proj": (4, 4, 2)}  # experts first
    assert bp.decoder_bytes(stacked, "m.", 1, 1, ()) == 8 * 2
    assert bp.distinct_experts(128, 8, 1) == pytest.approx(8)
    assert bp.distinct_experts(128, 8, 32) == pytest.approx(128 * (1 - (120 / 128) ** 32))


def test_a_tts_frame_reads_the_talker_once_and_the_code_predictor_each_step(tmp_path: Path) -> None:
    h, cp_h, inter = 8, 4, 16
    shapes = {
        "talker.model.layers.0.mlp.up_proj.weight": (inter, h),
        "talker.model.norm.weight": (h,),
        "talker.model.codec_embedding.weight": (50, h),
        "talker.codec_head.weight": (50, h),
        "talker.code_predictor.model.layers.0.mlp.up_proj.weight": (inter, cp_h),
        "talker.code_predictor.model.norm.weight": (cp_h,),
        "talker.code_predictor.small_to_mtp_projection.weight": (cp_h, h),
        **{f"talker.code_predictor.lm_head.{i}.weight": (20, cp_h) for i in range(3)},
    }
    write_header(tmp_path / "model.safetensors", shapes)
    kv = {"num_hidden_layers": 1, "num_key_value_heads": 1, "head_dim": 2}
    (tmp_path / "config.json").write_text(json.dumps({"talker_config": {
        **kv, "num_code_groups": 4, "code_predictor_config": kv}}))  # fmt: skip
    got = bp.tts_traffic(tmp_path, rows=2, frames=10)
    talker = (inter * h + h + 50 * h) * 2 + 2 * (2 * 2 * 5 * 2)  # weights, 2 rows of KV at 5
    cp_step = (inter * cp_h + cp_h + cp_h * h) * 2
    cp = 3 * cp_step + 3 * 20 * cp_h * 2 + 3 * 2 * (2 * 2 * 2 * 2)  # 3 steps, 3 heads, KV at 2
    assert got == {"token_bytes": 0.0, "frame_bytes": talker + cp}


def test_the_omni_bytes_come_from_a_real_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from edgeomni.export.tiny_omni import make_qwen3_omni

    ckpt = make_qwen3_omni(tmp_path / "omni")
    one, many = bp.omni_traffic(ckpt, 1, 10, 8, 16), bp.omni_traffic(ckpt, 32, 10, 8, 16)
    shapes = bp.tensor_shapes(ckpt)
    lm_head = bp.count(shapes["thinker.lm_head.weight"]) * 2
    assert lm_head < one["token_bytes"] < many["token_bytes"]  # more rows: more experts, more KV
    assert bp.count(shapes["talker.codec_head.weight"]) * 2 < one["frame_bytes"] < many["frame_bytes"]


def summary(ttfa: float, rtf: float, rate: float) -> dict:
    return {"requests": 4, "ttfa_p50_ms": ttfa, "rtf_p50": rtf, "audio_s_per_s": rate,
            "audio_s_per_request": 8.0}  # fmt: skip


def test_the_table_gives_ratios_and_the_fraction_of_the_bound() -> None:
    runs = {"onnxruntime": {"1": summary(40.0, 0.1, 10.0), "4": summary(80.0, 0.2, 30.0)},
            "fused": {"1": summary(20.0, 0.05, 20.0)}}  # fmt: skip
    traffic = {"token_bytes": 1e9, "frame_bytes": 2e9}
    rows = bp.compare(runs, lambda c: traffic, tokens=10, frames=100, bandwidth_gbs=1000.0)
    # 10 tokens and 100 frames read 210 GB: 0.21 s at 1000 GB/s for c requests of 8 s each
    assert rows[0]["bound_audio_s_per_s"] == pytest.approx(8 / 0.21, abs=0.05)
    assert rows[0]["fused"]["hbm_fraction"] == pytest.approx(20 / (8 / 0.21), abs=1e-3)
    assert rows[0]["first_audio_onnxruntime_over_fused"] == 2.0
    assert rows[0]["rtf_onnxruntime_over_fused"] == 2.0
    assert rows[0]["audio_s_per_s_fused_over_onnxruntime"] == 2.0
    assert rows[1]["fused"] is None and "rtf_onnxruntime_over_fused" not in rows[1]
    text = bp.markdown("t", rows, 1000.0)
    assert "| 4 | fused | not measured |" in text and "| 1 | 2.00x | 2.00x | 2.00x | 38.1 |" in text
    no_gpu = bp.compare(runs, lambda c: traffic, 10, 100, None)
    assert no_gpu[0]["bound_audio_s_per_s"] is None and no_gpu[0]["fused"]["hbm_fraction"] is None


def test_each_backend_runs_with_its_own_out_folder_and_the_first_alone_gets_extras(
    tmp_path: Path,
) -> None:
    seen: list[list[str]] = []

    def main(argv: list[str]) -> int:
        seen.append(argv)
        return len(seen) - 1

    codes = bp.run_backends(main, ["--frames", "5", "--backend", "onnxruntime", "fused"],
                            ["onnxruntime", "fused"], tmp_path, later=["--skip-transformers"])  # fmt: skip
    assert codes == {"onnxruntime": 0, "fused": 1}
    assert seen[0][-4:] == ["--backend", "onnxruntime", "--out", str(tmp_path / "onnxruntime")]
    assert "--skip-transformers" not in seen[0] and "--skip-transformers" in seen[1]
    assert seen[1][-4:] == ["--backend", "fused", "--out", str(tmp_path / "fused")]


@pytest.mark.parametrize("script", ["gpu_tts", "gpu_omni"])
def test_the_scripts_take_two_backends_once_each(script: str, tmp_path: Path) -> None:
    module = __import__(script)
    args = module.parse_args(["--out", str(tmp_path), "--backend", "onnxruntime", "fused"])
    assert args.backends == ["onnxruntime", "fused"] and args.backend == "onnxruntime"
    with pytest.raises(SystemExit):
        module.parse_args(["--out", str(tmp_path), "--backend", "fused", "fused"])
    with pytest.raises(SystemExit):  # the fused backend runs on cuda only
        module.parse_args(["--out", str(tmp_path), "--device", "cpu", "--backend",
                           "onnxruntime", "fused"])  # fmt: skip
