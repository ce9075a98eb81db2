"""Qwen3-Omni at run time: the thinker's media preparation (its audio and visual encoders, log-mel
features, image preprocessing and 3-axis rope positions), and its talker (its prompt layout
from the thinker's rows); the code predictor and code2wav are the shared speech pieces
(runtime/speech/)."""

from __future__ import annotations

from edgeomni.export.families.qwen3_omni import CODE2WAV_RUNNER, TALKER_RUNNER
from edgeomni.runtime.family import RuntimeFamily, register_family

# (runner name in the graph, kind, "module:attribute" of its factory, emit id -> kind)
RUNNERS = (
    (TALKER_RUNNER, "autoregressive", "edgeomni.runtime.families.qwen3_omni.talker:Talker",
     {"codes": "codec"}),
    (CODE2WAV_RUNNER, "iterative", "edgeomni.runtime.speech.code2wav:Code2Wav",
     {"audio": "audio"}),
)  # fmt: skip

# the thinker's media hook, by its engine config's model_type ("module:attribute")
MEDIA = {"qwen3_omni_moe": "edgeomni.runtime.families.qwen3_omni.media:MediaEncoders"}

# the keys its talker reads besides its graph inputs: talker_* for the first code, cp_* (or
# qwen3_tts_inference's subtalker_*) for the code predictor's residual codes
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

FAMILY = register_family(
    RuntimeFamily(
        name="qwen3_omni",
        label="Qwen3-Omni",
        runners=RUNNERS,
        media=MEDIA,
        stage_prefixes=PREFIXES,
        stage_keys=STAGE_KEYS,
        aliases=ALIASES,
        length_keys=LENGTH_KEYS,
    )
)
