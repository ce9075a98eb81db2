"""The AuT audio encoder of the Qwen3 families as one engine: mel chunks -> audio tokens.

Qwen3-Omni's (``thinker.audio_tower``, its projection proj1/act/proj2 inside the tower) and
Qwen3-ASR's (``model.audio_tower``, the same encoder with a 13-row positional table and no
projection, followed by the model's ``multi_modal_projector`` linear_1/act/linear_2) are one
graph here: an ``AudioTower`` names what differs (weight prefixes, config class, where the
projection lives, how chunks are padded). The parameters are transformers' own modules, so
checkpoint tensors load by name; only the forward is ours. HF's forward does not export: its non-flash attention
splits q/k/v with ``cu_seqlens.tolist()`` (a data-dependent guard), and its conv front end is
traced with one ``conv_chunksize`` split baked in, which breaks past 500 chunks.

Ours takes everything data-dependent as inputs the runtime computes in numpy
(runtime/media/audio_encoder.py) and runs the conv front end over all chunks
at once, so any number of chunks works (the runtime bounds memory by sending at most
``chunks_per_call`` chunks a call).
HF's block-diagonal attention over windows of ``n_window_infer`` frames is laid out as rows of a
batch: window w is row w, right-padded to the longest window, and the edgeomni::Attention plugin
op (causal=0, past 0, query_lens = the window's tokens) attends within each row only. So the
attention is exactly block-diagonal and its memory grows with audio length, not its square.

Engine I/O (C chunks, P the longest chunk's frames, W windows of at most S tokens, N tokens):
  padded_feature float32 [C, num_mel_bins, P]  chunk c = frames [c*2*n_window, ...), 0-padded
  window_index   int64 [W, S]  flat index c*T_P + t (T_P: tokens of P frames) of each window's
                               tokens; padding slots point at any valid token (0)
  window_lens    int32 [W]     tokens in each window
  output_index   int64 [N]     flat index w*S + j of each output token, in audio order
  -> last_hidden_state float32 [N, output_dim]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoderConfig,
)

from edgeomni.export.common.hf_module import hf_config, load_hf_module
from edgeomni.export.common.onnx_export import export_onnx
from edgeomni.plugins import attention as attention_plugin

PREFIX = "thinker.audio_tower."
ENGINE = "audio_encoder.onnx"
INPUTS = ("padded_feature", "window_index", "window_lens", "output_index")
OUTPUT = "last_hidden_state"
# torch.export needs a bound on the chunk axis (else "Specializations unexpectedly required").
MAX_CHUNKS = 1 << 20
# Windows per engine call by default: 8 windows = 64 chunks = 64 s of audio. The real model's
# first conv makes 6 MB of activations per chunk, so HF's conv_chunksize (500) would be 3 GB.
WINDOWS_PER_CALL = 8


@dataclass(frozen=True)
class AudioTower:
    """What a family's AuT encoder is in its checkpoint and at run time.

    ``encoder``/``config_class``: transformers' encoder module and its config class;
    ``prefix``: the encoder's weight prefix; ``sections``: where its config sits in config.json
    (each taken when present, so the encoder's own config dict works too); ``head``: the module
    (built from the whole config) and weight prefix of a projection that follows the encoder
    outside it (None: the encoder projects itself, proj1/act/proj2); ``model_type``: the engine
    config's; ``chunk_padding``: how the runtime pads a call's chunks, "longest" (to the longest
    chunk of the call: Qwen3-Omni's processor) or "full" (every chunk to 2 * n_window frames:
    Qwen3-ASR's feature extractor pads the mel to a multiple of it)."""

    encoder: Any
    config_class: Any
    prefix: str
    sections: tuple[str, ...]
    model_type: str
    head: tuple[Callable[[Mapping[str, Any]], nn.Module], str] | None = None
    chunk_padding: str = "longest"


OMNI = AudioTower(
    encoder=hf.Qwen3OmniMoeAudioEncoder,
    config_class=Qwen3OmniMoeAudioEncoderConfig,
    prefix=PREFIX,
    sections=("thinker_config", "audio_config"),
    model_type="qwen3_omni_moe",
)


def audio_config(config: Any, tower: AudioTower = OMNI) -> Any:
    """An audio encoder config from the config object, its dict, or a whole checkpoint's dict
    (the sections of ``tower``)."""
    return hf_config(config, tower.config_class, tower.sections, "an audio encoder")


def chunks_per_window(cfg: Any) -> int:
    """Chunks in one attention window (HF's n_window_infer // (2 * n_window))."""
    ratio = cfg.n_window_infer // (2 * cfg.n_window)
    if ratio < 1:
        raise ValueError(
            f"n_window_infer {cfg.n_window_infer} is shorter than one chunk ({2 * cfg.n_window})"
        )
    return ratio


def chunk_tokens(cfg: Any) -> int:
    """Tokens of one whole chunk (2 * n_window frames) after the three stride-2 convolutions."""
    return (((2 * cfg.n_window + 1) // 2 + 1) // 2 + 1) // 2


def load_audio_tower(
    get_tensor: Callable[[str], torch.Tensor], config: Any, tower: AudioTower = OMNI
) -> nn.Module:
    """HF's module with every parameter read from ``get_tensor(tower.prefix + name)``."""
    cfg = audio_config(config, tower)
    module = load_hf_module(tower.encoder, cfg, get_tensor, tower.prefix)
    # the sinusoidal table is a non-persistent buffer: rebuild it as HF's _init_weights does
    table = module.positional_embedding
    table.positional_embedding.copy_(table.compute_default_singular_positional_embedding())
    return module.eval()


def load_head(
    get_tensor: Callable[[str], torch.Tensor], config: Mapping[str, Any], tower: AudioTower
) -> nn.Module | None:
    """The projection after the encoder (``tower.head``) with its weights, or None."""
    if tower.head is None:
        return None
    make, prefix = tower.head
    return load_hf_module(lambda _cfg: make(config), None, get_tensor, prefix).eval()


class AudioEncoderGraph(nn.Module):
    """The exported graph: HF's audio encoder, window-batched, attention through the plugin,
    then its projection: the encoder's own proj1/act/proj2, or ``head`` (Qwen3-ASR's
    multi_modal_projector)."""

    def __init__(self, model: nn.Module, head: nn.Module | None = None) -> None:
        super().__init__()
        self.model = model
        self.head = head
        cfg = model.config
        self.num_heads = cfg.encoder_attention_heads
        self.head_dim = cfg.d_model // self.num_heads

    def _attention(self, attn: nn.Module, x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        w, s, _ = x.shape
        # an empty scratch cache of capacity S: one bidirectional call per window row
        scratch = x.new_zeros(w, self.num_heads, s, self.head_dim)
        out, _, _ = attention_plugin.torch_op()(
            attn.q_proj(x),
            attn.k_proj(x),
            attn.v_proj(x),
            scratch,
            scratch,
            torch.zeros_like(lens),
            lens,
            self.num_heads,
            self.num_heads,
            float(attn.scaling),
            0,
            0,
        )
        return attn.out_proj(out)

    def forward(
        self,
        padded_feature: torch.Tensor,
        window_index: torch.Tensor,
        window_lens: torch.Tensor,
        output_index: torch.Tensor,
    ) -> torch.Tensor:
        m = self.model
        x = padded_feature.unsqueeze(1)
        for conv in (m.conv2d1, m.conv2d2, m.conv2d3):
            x = F.gelu(conv(x))
        c, ch, f, t = x.shape
        x = m.conv_out(x.permute(0, 3, 1, 2).reshape(c, t, ch * f))
        x = x + m.positional_embedding.positional_embedding[:t].to(x.dtype)  # chunk-local
        w, s = window_index.shape
        h = x.reshape(c * t, -1).index_select(0, window_index.reshape(-1)).reshape(w, s, -1)
        for layer in m.layers:
            attn_in = layer.self_attn_layer_norm(h)
            h = h + self._attention(layer.self_attn, attn_in, window_lens)
            h = h + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(h))))
        h = h.reshape(w * s, -1).index_select(0, output_index)  # padding slots drop out here
        h = m.ln_post(h)
        return self.head(h) if self.head is not None else m.proj2(m.act(m.proj1(h)))


def export_audio_encoder(model: nn.Module, path: Path, head: nn.Module | None = None) -> Path:
    """Export with dynamic chunks, frames, windows and tokens (plugin op not yet lowered).

    Example sizes are at least 2 and distinct on every axis (torch.export specialises size 1).
    """
    from torch.export import Dim

    cfg = model.config
    chunk = 2 * cfg.n_window
    c, w, s, n = 3, 2, 10, 17
    t = chunk_tokens(cfg)
    args = (
        torch.zeros(c, cfg.num_mel_bins, chunk),
        (torch.arange(w * s) % (c * t)).reshape(w, s),
        torch.full((w,), s, dtype=torch.int32),
        torch.arange(n),
    )
    windows = Dim("windows")
    shapes = (
        {0: Dim("chunks", max=MAX_CHUNKS), 2: Dim("frames", max=chunk)},
        {0: windows, 1: Dim("window_len")},
        {0: windows},
        {0: Dim("tokens")},
    )
    return export_onnx(
        AudioEncoderGraph(model.eval(), head),
        args,
        Path(path),
        input_names=list(INPUTS),
        output_names=[OUTPUT],
        dynamic_shapes=shapes,
    )


def audio_engine_config(
    config: Any,
    *,
    backend: str = "onnxruntime",
    device: str = "cpu",
    tower: AudioTower = OMNI,
    min_samples: int = 0,
) -> dict[str, Any]:
    """config.json fields the runtime's AudioEncoder (runtime/media/audio_encoder.py)
    reads (write with artifacts.write_engine_config).

    ``chunks_per_call`` (whole windows) bounds the memory of one engine call; encoding in such
    pieces equals the one-call result exactly, because windows never share tokens and every
    piece is padded to the audio's longest chunk. The graph itself takes any number of chunks.
    ``chunk_padding`` is the tower's; ``min_samples``: 16 kHz samples a clip is zero-padded to
    before its log-mel (Qwen3-ASR's feature extractor's ``min_length``; 0: none).
    """
    cfg = audio_config(config, tower)
    per_window = chunks_per_window(cfg)
    return {
        "component": "audio_encoder",
        "model_type": tower.model_type,
        "engine": ENGINE,
        "backend": backend,
        "device": device,
        "dtype": "float32",
        "inputs": {
            "padded_feature": "float32 [chunks, num_mel_bins, longest_chunk_frames]",
            "window_index": "int64 [windows, window_len]",
            "window_lens": "int32 [windows]",
            "output_index": "int64 [tokens]",
        },
        "outputs": {OUTPUT: "float32 [tokens, output_dim]"},
        "num_mel_bins": cfg.num_mel_bins,
        "n_window": cfg.n_window,
        "n_window_infer": cfg.n_window_infer,
        "chunk_frames": 2 * cfg.n_window,
        "chunks_per_window": per_window,
        "chunks_per_call": WINDOWS_PER_CALL * per_window,
        "chunk_padding": tower.chunk_padding,
        "min_samples": min_samples,
        "d_model": cfg.d_model,
        "output_dim": cfg.output_dim,
    }


def audio_dim_ranges(cfg: Any) -> dict[str, Any]:
    """The sizes the runtime calls an audio encoder with (export/common/shapes.py): one call
    holds up to ``chunks_per_call`` chunks of one clip."""
    from edgeomni.export.common.shapes import upto

    per_window = chunks_per_window(cfg)
    chunks, tokens = WINDOWS_PER_CALL * per_window, chunk_tokens(cfg)
    return {
        "clip": {
            "chunks": upto(chunks),
            "frames": upto(2 * cfg.n_window),
            "windows": upto(WINDOWS_PER_CALL),
            "window_len": upto(per_window * tokens),
            "tokens": upto(chunks * tokens),
        },
    }
