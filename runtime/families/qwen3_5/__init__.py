"""Qwen3.5 at run time: its llm is the generic text model's runner over the declared row state;
a Qwen3_5ForConditionalGeneration build (engine config model_type "qwen3_5") reads images and
videos through the vision-language hook Qwen3-VL uses (runtime/media/vision_hook.py), unchanged: Qwen3.5's processor is Qwen3VLProcessor (the
same placeholders, and a video's frames each after its timestamp), its get_rope_index gives
Qwen3-VL's positions (a video split into frames of one temporal step), and its ViT has no
DeepStack, which the hook passes through as none (the llm has no DeepStack inputs). A
Qwen3_5ForCausalLM build ("qwen3_5_text") reads text only."""

from __future__ import annotations

from edgeomni.runtime.family import RuntimeFamily, register_family

# the llm's media hook, by its engine config's model_type ("module:attribute")
MEDIA = {"qwen3_5": "edgeomni.runtime.media.vision_hook:VisionMedia"}

FAMILY = register_family(RuntimeFamily(name="qwen3_5", label="Qwen3.5", media=MEDIA))
