"""Qwen3-Omni (model_type "qwen3_omni_moe"): thinker, talker, code predictor and code2wav. Its
build hooks are .build's; its runtime is runtime/families/qwen3_omni/, whose runners are
declared there under the names below, the ones its graphs use."""

from edgeomni.export.registry import Family, register_family

TALKER_RUNNER = "qwen3_omni.talker"
CODE2WAV_RUNNER = "qwen3_omni.code2wav"

FAMILY = register_family(Family(
    "qwen3_omni", ("qwen3_omni_moe",), f"{__name__}.build",
    "edgeomni.export.tiny_omni:make_qwen3_omni",
    ("--max-generate-length", "4", "--out-audio", "{tmp}/omni.wav", "--sampling",
     '{"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 4}'),
))  # fmt: skip
