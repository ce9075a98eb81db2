"""Qwen3-VL at run time: the LLM's media preparation (its visual encoder found beside it, image
and video preprocessing, a video's frames with their timestamps in the prompt, and 3-axis
positions for images and videos). The LLM itself is the generic text model's runner."""

from __future__ import annotations

from edgeomni.runtime.family import RuntimeFamily, register_family

# the LLM's media hook, by its engine config's model_type ("module:attribute")
MEDIA = {"qwen3_vl": "edgeomni.runtime.media.vision_hook:VisionMedia"}

FAMILY = register_family(RuntimeFamily(name="qwen3_vl", label="Qwen3-VL", media=MEDIA))
