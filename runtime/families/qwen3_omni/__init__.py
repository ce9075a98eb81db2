"""Qwen3-Omni at run time: the thinker's media preparation (its audio and visual encoders, log-mel
features, image preprocessing and 3-axis rope positions), and its talker (its prompt layout
from the thinker's rows); the code predictor and code2wav are the shared speech pieces
(runtime/speech/)."""

from __future__ import annotations

from edgeomni.export.families.qwen3_omni import CODE2WAV_RUNNER, TALKER_RUNNER
from edgeomni.runtime.family import RuntimeFamily, register_family
from edgeomni.runtime.speech import keys

# (runner name in the graph, kind, "module:attribute" of its factory, emit id -> kind)
RUNNERS = (
    (TALKER_RUNNER, "autoregressive", "edgeomni.runtime.families.qwen3_omni.talker:Talker",
     {"codes": "codec"}),
    (CODE2WAV_RUNNER, "iterative", "edgeomni.runtime.speech.code2wav:Code2Wav",
     {"audio": "audio"}),
)  # fmt: skip

# the thinker's media hook, by its engine config's model_type ("module:attribute")
MEDIA = {"qwen3_omni_moe": "edgeomni.runtime.families.qwen3_omni.media:MediaEncoders"}

FAMILY = register_family(RuntimeFamily(
    name="qwen3_omni", label="Qwen3-Omni", runners=RUNNERS, media=MEDIA, **keys.FAMILY_FIELDS
))  # fmt: skip
