"""Qwen3.5 (model types "qwen3_5_text", Qwen3_5ForCausalLM, and "qwen3_5", the language model
of Qwen3_5ForConditionalGeneration): a decoder of Gated DeltaNet (linear attention) and gated
full-attention layers (model.py), one llm stage run by the generic text model's runner. Its
row state is declared per layer: KV for the attention layers, convolution and recurrent state
for the DeltaNet layers. Its build hooks are .build's HOOKS; a ConditionalGeneration checkpoint
also builds its vision tower (visual.py), read at run time through Qwen3-VL's media hook
(runtime/families/qwen3_5/). The registered tiny is the text model; tiny.make_qwen3_5_vl makes
the image-text one."""

from edgeomni.export.registry import TEXT_SMOKE, Family, register_family

FAMILY = register_family(Family(
    "qwen3_5", ("qwen3_5_text", "qwen3_5"), f"{__name__}.build:HOOKS",
    tiny=f"{__name__}.tiny:make_qwen3_5", smoke=TEXT_SMOKE,
))  # fmt: skip
