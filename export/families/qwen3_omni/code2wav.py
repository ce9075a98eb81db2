"""Qwen3-Omni's code2wav: the shared vocoder graphs (export/speech/code2wav.py, whole windows,
and code2wav_stream.py, the stateful step) over transformers' ``Qwen3OmniMoeCode2Wav`` with the
checkpoint's ``code2wav.*`` weights, and their engine configs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeCode2WavConfig,
)

from edgeomni.export.common.hf_module import hf_config, load_hf_module
from edgeomni.export.speech.code2wav import (
    ENGINE,
    INPUT,
    LEFT_CONTEXT_FRAMES,
    MAX_FRAMES,
    OUTPUT,
    WINDOW_FRAMES,
    Code2WavGraph,
    export_graph,
    hf,
    receptive_field_frames,
    samples_per_frame,
    trim_samples,
)
from edgeomni.export.speech.code2wav_stream import StreamGraph, export_stream, stream_engine_config

PREFIX = "code2wav."
SAMPLE_RATE = 24000  # Qwen3-Omni's audio rate; not in the code2wav config


def code2wav_config(config: Any) -> Qwen3OmniMoeCode2WavConfig:
    """A code2wav config from the config object, its dict, or the whole Qwen3-Omni config dict."""
    return hf_config(config, Qwen3OmniMoeCode2WavConfig, ("code2wav_config",), "a code2wav")


def load_code2wav(
    get_tensor: Callable[[str], torch.Tensor], config: Any
) -> hf.Qwen3OmniMoeCode2Wav:
    """HF's module with every parameter read from ``get_tensor("code2wav." + name)``."""
    cfg = code2wav_config(config)
    module = load_hf_module(hf.Qwen3OmniMoeCode2Wav, cfg, get_tensor, PREFIX)
    # non-persistent buffers are not in the checkpoint: rebuild them as HF's _init_weights does
    offsets = torch.arange(cfg.num_quantizers).view(1, -1, 1) * cfg.codebook_size
    module.code_offset.copy_(offsets)
    return module.eval()


def export_code2wav(model: hf.Qwen3OmniMoeCode2Wav, path: Path) -> Path:
    """Export with dynamic batch and frames (plugin op not yet lowered); returns the model path.

    Example sizes are at least 2 on both axes (torch.export specialises axes of size 1); the
    graph still runs at T = 1.
    """
    cfg = model.config
    return export_graph(Code2WavGraph(model.eval()), cfg.codebook_size, cfg.num_quantizers, path)


def code2wav_engine_config(
    config: Any,
    *,
    backend: str = "onnxruntime",
    device: str = "cpu",
    max_frames: int = MAX_FRAMES,
) -> dict[str, Any]:
    """config.json fields the code2wav runner reads (write with artifacts.write_engine_config).

    ``left_context_frames`` is HF generate()'s 25: exact for small models, an approximation when
    ``receptive_field_frames`` is larger (the real config: 8 layers x window 72 -> about 580).
    """
    cfg = code2wav_config(config)
    return {
        "component": "code2wav",
        "model_type": "qwen3_omni_moe",
        "engine": ENGINE,
        "backend": backend,
        "device": device,
        "dtype": "float32",
        # the CUDA provider may run its float32 convolutions on TF32 tensor cores: the audio
        # stays within ~1% of the peak of exact float32 (tests/test_gpu.py), several times
        # faster; decoders run exact float32 (runtime/engine.py)
        "tf32": True,
        "inputs": {INPUT: "int64 [batch, num_quantizers, frames]"},
        "outputs": {OUTPUT: "float32 [batch, 1, frames*samples_per_frame - trim]"},
        "num_quantizers": cfg.num_quantizers,
        "codebook_size": cfg.codebook_size,
        "samples_per_frame": samples_per_frame(cfg),
        "trim": trim_samples(cfg),
        "sample_rate": SAMPLE_RATE,
        "window_frames": WINDOW_FRAMES,
        "left_context_frames": LEFT_CONTEXT_FRAMES,
        "receptive_field_frames": receptive_field_frames(cfg),
        "max_frames": max_frames,
        "profiles": {"batch": [1, 1], "frames": [1, max_frames]},
    }


def export_omni(model: hf.Qwen3OmniMoeCode2Wav, path: Path) -> Path:
    """Qwen3-Omni's step engine graph from HF's module (code2wav.load_code2wav)."""
    return export_stream(StreamGraph(model.eval()), model.config.codebook_size, path)


def omni_engine_config(config: Any, *, backend: str = "onnxruntime", device: str = "cpu") -> dict:
    """config.json fields of Qwen3-Omni's step engine (its layout from a dry run of the
    module built on the meta device: no weights read)."""
    cfg = code2wav_config(config)
    base = code2wav_engine_config(cfg, backend=backend, device=device)
    with torch.device("meta"):
        model = hf.Qwen3OmniMoeCode2Wav(cfg)
    return stream_engine_config(StreamGraph(model), base)
