"""The request keys a speech family's talker reads besides its graph inputs, the same for every
talker on the shared speech pieces (its RuntimeFamily declares them): talker_* for each frame's
first code, cp_* (or qwen3_tts_inference's subtalker_*) for the code predictor's residual
codes."""

from __future__ import annotations

PREFIXES = ("talker_", "cp_", "subtalker_")
_TALKER = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "sampling_seed",
           "max_new_tokens", "min_new_tokens", "do_sample")  # fmt: skip
_CODE_PREDICTOR = ("temperature", "top_k", "top_p", "dosample")
STAGE_KEYS = (
    *(f"talker_{name}" for name in _TALKER),
    *(f"{prefix}{name}" for prefix in PREFIXES[1:] for name in _CODE_PREDICTOR),
)
# set to n, these make the talker speak n frames
LENGTH_KEYS = ("talker_max_new_tokens", "talker_min_new_tokens")
# upstream's name of the talker's frame cap
ALIASES = {"max_audio_length": ("talker_max_new_tokens", "the talker's frame cap (the same as "
                                "talker_max_new_tokens)")}  # fmt: skip
# a speech family's RuntimeFamily fields for these keys
FAMILY_FIELDS = {"stage_prefixes": PREFIXES, "stage_keys": STAGE_KEYS, "aliases": ALIASES,
                 "length_keys": LENGTH_KEYS}  # fmt: skip
