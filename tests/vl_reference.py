"""Hugging Face reference outputs of a Qwen3-VL checkpoint, for parity tests (not a test file).

Inputs go through transformers' own ``Qwen3VLProcessor`` (its chat template, placeholder
expansion, video timestamps and ``mm_token_type_ids``) with the PIL image processor
(``Qwen2VLImageProcessorPil``). Its video processor (``Qwen3VLVideoProcessor``) needs
torchvision, which this project does not install: where torchvision imports it is used as it
is; elsewhere ``TorchVideoProcessor`` stands in for it, doing in torch what it does on a CPU:
torchvision's uint8 bicubic antialiased resize is ``torch.nn.functional.interpolate`` on the
uint8 frames (what ``tvF.resize`` calls for them), then the fused normalize and the
processor's view/permute patchify; the target size is the video smart_resize (the one piece
taken from the runtime: tests/test_video.py checks it against the real processor's output).
Everything is greedy (``do_sample=False``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass
class VLBundle:
    model: Any
    processor: Any
    tokenizer: Any
    video_settings: dict[str, Any]


class TorchVideoProcessor:
    """Qwen3VLVideoProcessor's CPU arithmetic in torch, for frames already sampled (see the
    module docstring); returns what it returns (pixel_values_videos, video_grid_thw and, as the
    processor asks, video_metadata)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.merge_size = settings["merge_size"]
        self.temporal_patch_size = settings["temporal_patch_size"]
        self.patch_size = settings["patch_size"]

    def pixels(self, frames: np.ndarray) -> tuple[torch.Tensor, list[int]]:
        from edgeomni.runtime.media.video import VideoSettings, target_size

        s = self.settings
        video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
        h, w = target_size(len(frames), *frames.shape[1:3], VideoSettings.from_config(s))
        video = torch.nn.functional.interpolate(video, size=(h, w), mode="bicubic",
                                                antialias=True)[None]  # fmt: skip
        mean = torch.tensor(s["image_mean"]) * (1.0 / s["rescale_factor"])
        std = torch.tensor(s["image_std"]) * (1.0 / s["rescale_factor"])
        video = (video.to(torch.float32) - mean.view(1, 1, 3, 1, 1)) / std.view(1, 1, 3, 1, 1)
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        if pad := -video.shape[1] % t:
            video = torch.cat((video, video[:, -1:].expand(-1, pad, -1, -1, -1)), dim=1)
        b, n, c = video.shape[:3]
        gt, gh, gw = n // t, h // p, w // p
        x = video.view(b, gt, t, c, gh // m, m, p, gw // m, m, p)
        x = x.permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
        return x.reshape(gt * gh * gw, c * t * p * p), [gt, gh, gw]

    def __call__(self, videos: list[np.ndarray], video_metadata: list[dict], **_: Any) -> dict:
        from transformers.video_utils import VideoMetadata

        out = [self.pixels(v) for v in videos]
        return {
            "pixel_values_videos": torch.cat([o[0] for o in out]),
            "video_grid_thw": torch.tensor([o[1] for o in out]),
            "video_metadata": [VideoMetadata(**m) for m in video_metadata],
        }


def load_bundle(ckpt: Path, model_class: Any = None) -> VLBundle:
    """The checkpoint's model (``model_class``, default Qwen3VLForConditionalGeneration; Qwen3.5
    shares the processor) and processor."""
    from transformers import (
        AutoTokenizer,
        Qwen2VLImageProcessorPil,
        Qwen3VLForConditionalGeneration,
    )
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    ckpt = Path(ckpt)
    model_class = model_class or Qwen3VLForConditionalGeneration
    model = model_class.from_pretrained(ckpt, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    image = Qwen2VLImageProcessorPil(**json.loads((ckpt / "preprocessor_config.json").read_text()))
    settings = json.loads((ckpt / "video_preprocessor_config.json").read_text())
    try:
        from transformers import Qwen3VLVideoProcessor

        video: Any = Qwen3VLVideoProcessor(**{**settings, "do_sample_frames": False})
    except ImportError:  # no torchvision
        video = TorchVideoProcessor(settings)

    class Processor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, name: str, arg: Any) -> Any:
            if name == "video_processor" and isinstance(arg, TorchVideoProcessor):
                return None
            return super().check_argument_for_proper_class(name, arg)

    template = (ckpt / "chat_template.jinja").read_text()
    processor = Processor(image_processor=image, tokenizer=tokenizer, video_processor=video,
                          chat_template=template)  # fmt: skip
    return VLBundle(model, processor, tokenizer, settings)


@dataclass(frozen=True)
class Video:
    """Frames as a request gives them: uint8 [T, H, W, 3] at ``fps`` frames a second."""

    frames: np.ndarray
    fps: float


def build_inputs(bundle: VLBundle, content: list[Any]) -> dict[str, torch.Tensor]:
    """One user turn: ``content`` is text (str), images (uint8 [H, W, 3]) and Video, in order."""
    from PIL import Image

    parts, images, videos, metadata = [], [], [], []
    for item in content:
        if isinstance(item, str):
            parts.append({"type": "text", "text": item})
        elif isinstance(item, Video):
            parts.append({"type": "video", "video": "<frames>"})
            videos.append(item.frames)
            n = len(item.frames)
            metadata.append({"total_num_frames": n, "fps": item.fps,
                             "frames_indices": list(range(n))})  # fmt: skip
        else:
            parts.append({"type": "image", "image": "<pixels>"})
            images.append(Image.fromarray(item))
    messages = [{"role": "user", "content": parts}]
    text = bundle.processor.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)  # fmt: skip
    kwargs: dict[str, Any] = {}
    if videos:
        kwargs.update(videos=videos, video_metadata=metadata, do_sample_frames=False)
    return dict(bundle.processor(text=[text], images=images or None, return_tensors="pt",
                                 **kwargs))  # fmt: skip


def greedy(bundle: VLBundle, inputs: dict[str, torch.Tensor], max_new_tokens: int) -> list[int]:
    """transformers' greedy generate on one prompt: the new token ids (EOS included)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: thread hand-offs cost more than they give
    try:
        with torch.no_grad():
            out = bundle.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    finally:
        torch.set_num_threads(before)
    return out[0, inputs["input_ids"].shape[1] :].tolist()
