"""The toy family's build hooks (export/family.py's FamilyHooks): ``shift``, and with a
``guide`` config section ``guide``, a tiny Qwen3-style decoder (export/common/decoder.py's
CausalLM) exported as the text families export theirs, with classifier-free guidance in its
graph when the section says ``in_graph`` (decoder.WithGuidance)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.decoder import CausalLM, DecoderConfig
from edgeomni.export.common.decoder_weights import load_decoder
from edgeomni.export.common.onnx_export import export_causal_lm, export_onnx
from edgeomni.export.family import BuildArgs, Component
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage
from toy_family import GUIDE_RUNNER, SHIFT_RUNNER

SHIFT = Component("shift", ".", "shift.onnx", SHIFT_RUNNER)
GUIDE = Component("guide", "guide", "guide.onnx", GUIDE_RUNNER)
BOS = 256  # the guide's start token, after the 256 bytes


class Shift(torch.nn.Module):
    def __init__(self, shift: torch.Tensor) -> None:
        super().__init__()
        self.shift = torch.nn.Parameter(shift.float().reshape(1), requires_grad=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return codes + self.shift


def guide_config(ckpt: Checkpoint) -> DecoderConfig:
    g = ckpt.config["guide"]
    return DecoderConfig(
        hidden_size=g["hidden_size"], num_layers=g["num_hidden_layers"],
        num_heads=g["num_attention_heads"], num_kv_heads=g["num_key_value_heads"],
        head_dim=g["head_dim"], intermediate_size=g["intermediate_size"],
        vocab_size=g["vocab_size"], rms_norm_eps=g["rms_norm_eps"], rope_theta=g["rope_theta"],
    )  # fmt: skip


def components(ckpt: Checkpoint) -> tuple[Component, ...]:
    return (SHIFT, GUIDE) if "guide" in ckpt.config else (SHIFT,)


def export_component(
    ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
) -> Path:
    if component == GUIDE:
        module = CausalLM(guide_config(ckpt)).eval()
        load_decoder(module, lambda name: ckpt.tensor("guide." + name), prefix="",
                     lm_head="lm_head.weight", dtype=torch.float32, where=str(ckpt.path))  # fmt: skip
        return export_causal_lm(module, work_dir / GUIDE.engine,
                                logits_topk=args.logits_topk or 0,
                                guidance=bool(ckpt.config["guide"].get("in_graph")))  # fmt: skip
    module = Shift(ckpt.tensor("shift")).eval()
    n = torch.export.Dim("n", min=1, max=4096)
    return export_onnx(module, (torch.zeros(1, 8),), work_dir / "shift.onnx",
                       input_names=["codes"], output_names=["shifted"],
                       dynamic_shapes=({1: n},))  # fmt: skip


def write_artifacts(ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs) -> None:
    if component == GUIDE:
        artifacts.write_embedding(ckpt.tensor("guide.model.embed_tokens.weight"), out_dir)
        artifacts.write_engine_config(out_dir, {
            **artifacts.engine_fields(ckpt, component, args),
            **artifacts.decoder_fields(guide_config(ckpt), args.dtype),
            "bos_token_id": BOS, "builder_config": artifacts.build_limits(args),
        })  # fmt: skip
        return
    artifacts.write_engine_config(out_dir, {
        "component": component.name, "model_type": ckpt.model_type, "engine": component.engine,
        "backend": args.backend, "device": args.device, "dtype": "float32",
        "builder_config": artifacts.build_limits(args),
    })  # fmt: skip


def multistage_topology(bundle: Checkpoint, components: Mapping[str, str], args: Any) -> Graph:
    text = (Emit(id="text", kind="text", transport="chunk_stream", terminal=True),)
    stage = Stage(
        id="shift",
        runner=SHIFT_RUNNER,
        artifact=components["shift"],
        kind="iterative",
        inputs=(Input("text", "request:messages", "fail"), Input("rot", "request:rot", "skip")),
        emits=text,
    )
    if "guide" not in components:
        return Graph(SCHEMA_VERSION, ("shift:text",), (stage,))
    guide = Stage(
        id="guide",
        runner=GUIDE_RUNNER,
        artifact=components["guide"],
        kind="autoregressive",
        inputs=(Input("prompt", "request:messages", "fail"),
                Input("guidance_scale", "request:guidance_scale", "skip"),
                Input("negative_prompt", "request:negative_prompt", "skip")),  # fmt: skip
        emits=text,
    )
    return Graph(SCHEMA_VERSION, ("shift:text", "guide:text"), (stage, guide))
