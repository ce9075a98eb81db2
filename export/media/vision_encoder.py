"""The Qwen3 ViT with DeepStack taps as one engine: patches -> merged embeddings + DeepStack.

Qwen3-Omni's and Qwen3-VL's vision encoders are one network under two sets of names: a
``VisionSpec`` says which transformers module and config class, which checkpoint prefix and
which attribute holds the DeepStack mergers (``OMNI`` here; a family passes its own). The
parameters are transformers' own modules, so checkpoint tensors load by name
(``<prefix><module path>``); only the forward is ours. A ViT without DeepStack (Qwen3.5's:
``deepstack_mergers`` None) has the one output ``image_embeds``. HF's forward
derives its index tensors from ``grid_thw`` with ``repeat_interleave``/``.tolist()``, which do
not trace, and its sdpa path splits attention per frame with ``cu_seqlens.tolist()`` (export
fixes the split count). Here every index the runtime can compute in numpy is an engine input
(runtime/media/visual_encoder.py builds them), and attention goes through the
edgeomni::Attention plugin op with ``causal=0``: each frame (segment) is its own batch row,
right-padded to the longest, with ``query_lens`` = its length, so attention is exactly
block-diagonal.

The other differences from HF are exact up to float rounding: the Conv3d patch embedding
(kernel = stride = the patch) is the same dot product as a Linear on the flattened patch, and
the tokens are gathered into / scattered out of the padded segment rows around attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeVisionEncoderConfig,
)

from edgeomni.export.common.hf_module import hf_config, load_hf_module
from edgeomni.export.common.onnx_export import export_onnx
from edgeomni.export.common.shapes import DimRanges, upto
from edgeomni.plugins import attention as attention_plugin


@dataclass(frozen=True)
class VisionSpec:
    """Where one family's ViT lives: its transformers module and config class, the config
    sections above its vision config, its checkpoint prefix, the attribute holding its
    DeepStack mergers (None: it has none), and the model_type its engine config records."""

    module: Any
    config: Any
    sections: tuple[str, ...]
    prefix: str
    deepstack_mergers: str | None
    model_type: str


OMNI = VisionSpec(
    module=hf.Qwen3OmniMoeVisionEncoder,
    config=Qwen3OmniMoeVisionEncoderConfig,
    sections=("thinker_config", "vision_config"),
    prefix="thinker.visual.",
    deepstack_mergers="merger_list",
    model_type="qwen3_omni_moe",
)
PREFIX = OMNI.prefix
ENGINE = "visual.onnx"
INPUTS = (
    "pixel_values",  # float32 [N, 3*T*P*P]: patches in merge-block order (runtime's image.py)
    "pos_indices",  # int64 [N, 4]: bilinear taps into the position-embedding grid
    "pos_weights",  # float32 [N, 4]: their weights (align_corners)
    "rotary_ids",  # int64 [N, 2]: (row, column) of each patch, for the 2-D rotary embedding
    "segment_tokens",  # int64 [B, S]: token index at each slot of each frame row (pad: any)
    "segment_lens",  # int32 [B]: tokens in each frame row
    "token_slots",  # int64 [N]: row * S + slot of each token
)
OUTPUTS = ("image_embeds", "deepstack")


def vision_config(config: Any, spec: VisionSpec = OMNI) -> Any:
    """A vision config from the config object, its dict, or the dict of the config sections
    above it (a thinker's, a whole checkpoint's)."""
    return hf_config(config, spec.config, spec.sections, "a vision")


def deepstack_taps(cfg: Any) -> list[int]:
    """The blocks a DeepStack merger reads; none for a ViT without them (Qwen3.5's config has
    no ``deepstack_visual_indexes``)."""
    return list(getattr(cfg, "deepstack_visual_indexes", None) or ())


def _inv_freq(model: nn.Module) -> torch.Tensor:
    """The axial rotary frequencies, as the model's own rotary class computes them."""
    rotary = type(model.rotary_pos_emb)
    inv_freq, _ = rotary.compute_axial_rope_parameters(model.config)
    return inv_freq.float()


def load_visual(
    get_tensor: Callable[[str], torch.Tensor], config: Any, spec: VisionSpec = OMNI
) -> nn.Module:
    """HF's module with every parameter read from ``get_tensor(spec.prefix + name)``."""
    cfg = vision_config(config, spec)
    module = load_hf_module(spec.module, cfg, get_tensor, spec.prefix)
    # the rotary frequencies are a non-persistent buffer, not in the checkpoint
    module.rotary_pos_emb.inv_freq.copy_(_inv_freq(module))
    return module.eval()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class VisualGraph(nn.Module):
    """The exported graph: HF's vision encoder with precomputed indices and plugin attention.
    ``mergers``: the attribute holding its DeepStack mergers (``VisionSpec.deepstack_mergers``;
    None: it has none, and ``image_embeds`` is its one output)."""

    def __init__(self, model: nn.Module, mergers: str | None = OMNI.deepstack_mergers) -> None:
        super().__init__()
        cfg = model.config
        taps = deepstack_taps(cfg)
        if mergers is not None and not taps:
            raise ValueError("the vision encoder has no deepstack_visual_indexes")
        self.model = model
        self.mergers = getattr(model, mergers) if mergers is not None else None
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.deepstack = {layer: i for i, layer in enumerate(taps)} if mergers else {}
        self.register_buffer("inv_freq", _inv_freq(model), persistent=False)

    def _rotary(self, rotary_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """HF's axial rope: (row, column) frequencies concatenated, then repeated: [N, 1, D]."""
        freqs = rotary_ids[..., None].float() * self.inv_freq  # [N, 2, D/4]
        freqs = torch.cat((freqs[:, 0], freqs[:, 1]), dim=-1)
        freqs = torch.cat((freqs, freqs), dim=-1)[:, None]
        return freqs.cos(), freqs.sin()

    def _attention(
        self,
        attn: nn.Module,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        segment_tokens, segment_lens, token_slots = layout
        n = x.shape[0]
        rows, width = segment_tokens.shape
        q, k, v = attn.qkv(x).reshape(n, 3, self.num_heads, self.head_dim).unbind(1)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        # packed tokens -> one right-padded row per frame
        q, k, v = (t.reshape(n, -1)[segment_tokens] for t in (q, k, v))
        scratch = x.new_zeros(rows, self.num_heads, width, self.head_dim)
        out, _, _ = attention_plugin.torch_op()(
            q,
            k,
            v,
            scratch,
            scratch,
            torch.zeros(rows, dtype=torch.int32),
            segment_lens,
            self.num_heads,
            self.num_heads,
            float(attn.scaling),
            0,
            0,  # causal=0: bidirectional within a row, so block-diagonal over the frames
        )
        return attn.proj(out.reshape(rows * width, -1)[token_slots])

    def forward(
        self,
        pixel_values: torch.Tensor,
        pos_indices: torch.Tensor,
        pos_weights: torch.Tensor,
        rotary_ids: torch.Tensor,
        segment_tokens: torch.Tensor,
        segment_lens: torch.Tensor,
        token_slots: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        m = self.model
        proj = m.patch_embed.proj
        x = F.linear(pixel_values, proj.weight.reshape(proj.out_channels, -1), proj.bias)
        x = x + (m.pos_embed(pos_indices) * pos_weights[:, :, None]).sum(1)
        rope = self._rotary(rotary_ids)
        layout = (segment_tokens, segment_lens, token_slots)
        deepstack = []
        for i, block in enumerate(m.blocks):
            x = x + self._attention(block.attn, block.norm1(x), rope, layout)
            x = x + block.mlp(block.norm2(x))
            if i in self.deepstack:
                assert self.mergers is not None
                deepstack.append(self.mergers[self.deepstack[i]](x))
        if not self.deepstack:
            return (m.merger(x),)
        return m.merger(x), torch.stack(deepstack)


def example_inputs(cfg: Any) -> tuple[torch.Tensor, ...]:
    """Three images of 2x2, 2x3 and 1x2 merge blocks (4x4, 4x6 and 2x4 patches at merge 2):
    every dynamic axis has a distinct size > 1 (torch.export specialises axes of size 1 and may
    tie axes of equal example size), each a whole number of merge blocks."""
    merge = cfg.spatial_merge_size
    lens = [blocks * merge * merge for blocks in (4, 6, 2)]
    n, rows, width = sum(lens), len(lens), max(lens)
    starts = [sum(lens[:i]) for i in range(rows)]
    tokens = torch.tensor(
        [[s + min(j, ln - 1) for j in range(width)] for s, ln in zip(starts, lens, strict=True)]
    )
    slots = torch.cat([torch.arange(ln) + r * width for r, ln in enumerate(lens)])
    side = int(math.isqrt(cfg.num_position_embeddings))
    patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    return (
        torch.randn(n, patch_dim),
        torch.randint(0, side * side, (n, 4)),
        torch.rand(n, 4),
        torch.randint(0, 4 * merge, (n, 2)),
        tokens,
        torch.tensor(lens, dtype=torch.int32),
        slots,
    )


def export_visual(model: nn.Module, path: Path, spec: VisionSpec = OMNI) -> Path:
    """Export with dynamic tokens (a multiple of merge^2), frames and frame length (plugin op
    not yet lowered); returns the model path."""
    from torch.export import Dim

    cfg = model.config
    unit = cfg.spatial_merge_size**2
    tokens = unit * Dim("merged_tokens", min=1, max=2**24)
    rows, width = Dim("segments", max=2**20), Dim("segment_len", max=2**24)
    shapes = (
        {0: tokens},
        {0: tokens},
        {0: tokens},
        {0: tokens},
        {0: rows, 1: width},
        {0: rows},
        {0: tokens},
    )
    return export_onnx(
        VisualGraph(model.eval(), spec.deepstack_mergers),
        example_inputs(cfg),
        Path(path),
        input_names=INPUTS,
        output_names=OUTPUTS if spec.deepstack_mergers else OUTPUTS[:1],
        dynamic_shapes=shapes,
    )


# where a checkpoint keeps each processor's settings: its own file, or a section of
# processor_config.json (what transformers 5's processor save_pretrained writes)
PROCESSOR_FILES = {
    "image": ("preprocessor_config.json", "image_processor"),
    "video": ("video_preprocessor_config.json", "video_processor"),
}


def processor_settings(model_dir: Path, kind: str, required: bool = False) -> dict[str, Any] | None:
    """The checkpoint's ``kind`` ("image" or "video") processor settings, which the visual
    engine folder keeps, or None where it ships none (a CheckpointError when ``required``)."""
    import json

    from edgeomni.export.common.checkpoint import CheckpointError

    own, key = PROCESSOR_FILES[kind]
    for name, sub in ((own, None), ("processor_config.json", key)):
        path = Path(model_dir) / name
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except ValueError as e:
                raise CheckpointError(f"{path}: not valid JSON ({e})") from None
            data = data.get(sub, {}) if sub and isinstance(data, dict) else data
            if isinstance(data, dict) and data:
                return data
    if required:
        raise CheckpointError(f"{model_dir}: no {kind} processor settings ({own})")
    return None


def image_video_settings(ckpt: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A vision-language checkpoint's image processor settings (required) and its video
    processor's (None: the build reads no video), as it ships them (Qwen3-VL, Qwen3.5)."""
    image = processor_settings(ckpt.path, "image", required=True)
    assert image is not None
    return image, processor_settings(ckpt.path, "video")


# the token ids a vision-language llm's media hook expands and positions (its engine config's
# media_tokens), at config.json's top level (Qwen3-VL, Qwen3.5)
MEDIA_TOKENS = ("image_token_id", "video_token_id", "vision_start_token_id",
                "vision_end_token_id")  # fmt: skip
# attention rows (frames) one visual call may hold beside what the prompt limit allows: a
# video's frames each take at least a timestamp, two brackets and one merged token
MIN_SEGMENTS = 16
TOKENS_PER_FRAME = 4


def media_tokens(cfg: dict[str, Any]) -> dict[str, int]:
    """The placeholder and vision-bracket ids (config.json's top level)."""
    from edgeomni.export.common.checkpoint import CheckpointError

    out = {}
    for key in MEDIA_TOKENS:
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise CheckpointError(f"config.json: {key} is missing or not an integer")
        out[key] = value
    return out


def visual_ranges(config: Any, prompt: int, segments: int, spec: VisionSpec = OMNI) -> DimRanges:
    """The sizes one call of the visual engine takes (export/common/shapes.py): the patches of
    one prompt's media (merge^2 patches per merged token, at most ``prompt`` merged tokens) in
    at most ``segments`` frames."""
    unit = vision_config(config, spec).spatial_merge_size ** 2
    return {
        "images": {
            f"{unit}*merged_tokens": upto(unit * prompt, lo=unit),
            "segments": upto(segments, opt=1),
            "segment_len": upto(unit * prompt),
        },
    }


def visual_engine_config(
    config: Any,
    backend: str = "onnxruntime",
    device: str = "cpu",
    *,
    image_processor: Mapping[str, Any] | None = None,
    video_processor: Mapping[str, Any] | None = None,
    spec: VisionSpec = OMNI,
) -> dict[str, Any]:
    """config.json fields runtime/media/visual_encoder.py reads (write with
    artifacts.write_engine_config).

    ``image_processor`` and ``video_processor``: the checkpoint's processor settings
    (preprocessor_config.json and video_preprocessor_config.json, or processor_config.json's
    sections), copied so the engine folder can preprocess alone.
    """
    cfg = vision_config(config, spec)
    taps = deepstack_taps(cfg) if spec.deepstack_mergers else []
    side = int(math.isqrt(cfg.num_position_embeddings))
    if side * side != cfg.num_position_embeddings:
        raise ValueError(f"num_position_embeddings {cfg.num_position_embeddings} is not a square")
    patch_dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    body: dict[str, Any] = {
        "component": "visual",
        "model_type": spec.model_type,
        "engine": ENGINE,
        "backend": backend,
        "device": device,
        "dtype": "float32",
        "inputs": {
            "pixel_values": f"float32 [tokens, {patch_dim}]",
            "pos_indices": "int64 [tokens, 4]",
            "pos_weights": "float32 [tokens, 4]",
            "rotary_ids": "int64 [tokens, 2]",
            "segment_tokens": "int64 [segments, segment_len]",
            "segment_lens": "int32 [segments]",
            "token_slots": "int64 [tokens]",
        },
        "outputs": {
            "image_embeds": f"float32 [tokens/{cfg.spatial_merge_size**2}, {cfg.out_hidden_size}]",
            **({"deepstack": f"float32 [{len(taps)}, tokens/{cfg.spatial_merge_size**2}, "
                             f"{cfg.out_hidden_size}]"} if taps else {}),
        },
        "hidden_size": cfg.hidden_size,
        "out_hidden_size": cfg.out_hidden_size,
        "num_heads": cfg.num_heads,
        "depth": cfg.depth,
        "in_channels": cfg.in_channels,
        "patch_size": cfg.patch_size,
        "temporal_patch_size": cfg.temporal_patch_size,
        "spatial_merge_size": cfg.spatial_merge_size,
        "patch_dim": patch_dim,
        "num_grid_per_side": side,
        "position_interpolation": "bilinear_align_corners",
        "deepstack_visual_indexes": taps,
    }
    if image_processor is not None:
        body["image_processor"] = dict(image_processor.get("image_processor", image_processor))
    if video_processor is not None:
        body["video_processor"] = dict(video_processor.get("video_processor", video_processor))
    return body


def vision_language_encoder(spec: Callable[[], VisionSpec], prefix: str) -> Any:
    """A vision-language llm's visual encoder (Qwen3-VL's, Qwen3.5's), built beside the llm and
    called by its runner (a text_family.Encoder): images and videos, the checkpoint's processor
    settings, one request's media a call. ``spec`` makes the family's VisionSpec (on first
    use, with transformers); ``prefix``: its weights' (the spec's)."""
    from edgeomni.export.common.text_family import Encoder
    from edgeomni.export.family import Component
    from edgeomni.export.registry import LLM_RUNNER
    from edgeomni.graph_schema import Input

    def export(ckpt: Any, path: Path) -> Path:
        s = spec()
        return export_visual(load_visual(ckpt.tensor, ckpt.config, s), path, s)

    def engine_config(ckpt: Any, args: Any) -> dict[str, Any]:
        image, video = image_video_settings(ckpt)
        return visual_engine_config(ckpt.config, args.backend, args.device,
                                    image_processor=image, video_processor=video,
                                    spec=spec())  # fmt: skip

    def ranges(ckpt: Any, args: Any) -> DimRanges:
        """One request's image or video (a frame a segment)."""
        segments = max(MIN_SEGMENTS, args.max_input_len // TOKENS_PER_FRAME)
        return visual_ranges(ckpt.config, args.max_input_len, segments, spec())

    def module(ckpt: Any) -> nn.Module:
        s = spec()
        return s.module(vision_config(ckpt.config, s))

    return Encoder(
        component=Component("visual", "visual", ENGINE, LLM_RUNNER),
        weights=prefix, config="vision_config", export=export,
        inputs=(Input("image", "request:image", "skip"), Input("video", "request:video", "skip")),
        engine_config=engine_config, ranges=ranges, module=module, check=image_video_settings,
    )  # fmt: skip
