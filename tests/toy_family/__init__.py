"""A test-only model family, defined entirely here and registered through the public API the
way an out-of-tree family is: a module named by ``EDGEOMNI_FAMILIES`` (or an ``edgeomni.families``
entry point) that registers its export and runtime declarations. No generic file knows it.

Its checkpoint (model_type ``edgeomni_toy``, written by ``tiny.make``) holds one weight, a shift;
its component is a torch module exported to ONNX that adds the shift to the code points of a
text, and its stage (runner ``edgeomni_toy.shift``) answers a request's last user message
shifted, Caesar-style: "HAL" with shift 1 is "IBM". It declares a request control (``rot``, an
extra shift, with an edge-infer flag and a speech-body field) and a stage prefix (``shift_``).

A checkpoint made with ``guide`` adds a second component and stage, ``guide``: a tiny random
decoder over bytes, run by the generic decoder stage with classifier-free guidance. A request
with ``guidance_scale`` holds two rows there, its message's and its ``negative_prompt``'s
(default empty), and draws each byte from ``uncond + scale * (cond - uncond)``; any other holds
one (runner.py). Standard library only: the runtime imports it on a board without torch.
"""

from __future__ import annotations

from typing import Any

from edgeomni.export.registry import Family, register_family
from edgeomni.runtime.family import RequestKey, RuntimeFamily
from edgeomni.runtime.family import register_family as register_runtime_family

MODEL_TYPE = "edgeomni_toy"
SHIFT_RUNNER = "edgeomni_toy.shift"  # the name its graphs use and its runtime declares
GUIDE_RUNNER = "edgeomni_toy.guide"


def _rot(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 26:
        raise ValueError(f"{key} must be an integer in 0..25, got {value!r}")
    return value


def _scale(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise ValueError(f"{key} must be a number >= 0, got {value!r}")
    return float(value)


EXPORT = register_family(
    Family(
        name="edgeomni_toy",
        model_types=(MODEL_TYPE,),
        module="toy_family.build",
        tiny="toy_family.tiny:make",
        smoke=("--rot", "0"),
    )
)

RUNTIME = register_runtime_family(
    RuntimeFamily(
        name="edgeomni_toy",
        label="toy",
        runners=((SHIFT_RUNNER, "iterative", "toy_family.runner:Shift", {"text": "text"}),
                 (GUIDE_RUNNER, "autoregressive", "toy_family.runner:Guide", {"text": "text"})),
        request_keys={
            "rot": RequestKey(
                "an extra shift of the toy's answer (the toy family)",
                check=_rot,
                flag="--rot",
                flag_type=int,
                flag_help="the toy's extra shift",
                speech_field="rot",
                speaks=False,
            ),
            "guidance_scale": RequestKey(
                "the toy guide's classifier-free guidance scale: two rows (the toy family)",
                check=_scale, speaks=False,
            ),
            "negative_prompt": RequestKey(
                "the toy guide's unconditional prompt (the toy family)", speaks=False
            ),
        },  # fmt: skip
        stage_prefixes=("shift_",),
        stage_keys=("shift_seed",),
    )
)
