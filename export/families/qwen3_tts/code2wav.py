"""Qwen3-TTS's 12 Hz codec decoder (code2wav): codes [B, 16, T] -> waveform [B, T*1920] at 24 kHz.

Transformers has no Qwen3-TTS, but Qwen3-Omni's code2wav is the same design, so its modules are
reused where they fit (the sliding-window transformer, ConvNeXt upsampling, SnakeBeta decoder
blocks, causal convs) and the parameters load by upstream's names (``decoder.<module path>`` in
``speech_tokenizer/model.safetensors``). What differs from Omni, matching qwen-tts 0.1.1's
``Qwen3TTSTokenizerV2Decoder``:

- the input is a split RVQ (1 semantic + 15 acoustic codebooks), each codebook's table being
  ``embedding_sum / clamp(cluster_usage, 1e-5)``; each group sums its rows and applies a 1x1
  ``output_proj``; the groups' sums are added (Omni: one embedding table, mean over codebooks);
- ``pre_conv`` (causal conv, kernel 3) and the transformer's ``input_proj`` / ``output_proj``
  around it, since the codebook, latent, transformer and decoder widths all differ;
- the transposed convs trim ``kernel - stride`` samples from the right only (Omni: both ends),
  so T frames give exactly T * 1920 samples.

``export_code2wav`` exports it the way Qwen3-Omni's code2wav is exported (its ``Code2WavGraph``:
attention through the edgeomni::CachedAttention plugin op, stride-1 causal convs padded on the
left only), with this decoder's input stage and projections around the transformer.

The whole sequence is decoded at once (upstream's ``chunked_decode`` cuts 300-frame windows with
25 frames of left context; for up to 300 frames the two are the same computation).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeCode2WavConfig,
)

from edgeomni.export.common.checkpoint import CheckpointError, open_checkpoint
from edgeomni.export.common.hf_module import load_hf_module
from edgeomni.export.speech import code2wav as omni
from edgeomni.export.speech import code2wav_stream as stream

PREFIX = "decoder."
# Encoder-side projections of the quantizer (audio -> codes); decoding never reads them.
UNUSED_SUFFIXES = ("quantizer.rvq_first.input_proj.weight", "quantizer.rvq_rest.input_proj.weight")
SEMANTIC_CODEBOOKS = 1  # upstream's SplitResidualVectorQuantizer(n_q_semantic=1)
CODEBOOK_EPSILON = 1e-5  # EuclideanCodebook's clamp on cluster_usage
WHERE = "speech_tokenizer/config.json: decoder_config."
# Qwen3TTSTokenizerV2DecoderConfig's defaults, for keys a config.json leaves out (it has none
# for codebook_dim, which the decoder reads all the same: required)
DEFAULTS: dict[str, Any] = {
    "codebook_size": 2048, "hidden_size": 1024, "latent_dim": 1024,
    "max_position_embeddings": 8000, "rope_theta": 10000, "num_attention_heads": 16,
    "num_key_value_heads": 16, "attention_bias": False, "sliding_window": 72,
    "intermediate_size": 3072, "hidden_act": "silu", "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-5, "num_hidden_layers": 8, "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
    "attention_dropout": 0.0,
}  # fmt: skip


SIZES = ("codebook_size", "codebook_dim", "hidden_size", "latent_dim", "num_attention_heads",
         "num_key_value_heads", "intermediate_size", "num_hidden_layers", "decoder_dim",
         "max_position_embeddings")  # fmt: skip


def decoder_settings(dec: Any) -> dict[str, Any]:
    """``decoder_config`` over upstream's defaults, refusing (a CheckpointError naming the key)
    what upstream's decoder cannot run or this export would compute differently."""
    if not isinstance(dec, dict):
        raise CheckpointError(f"{WHERE[:-1]} is missing or not an object")
    dec = {**DEFAULTS, **dec}
    window = dec["sliding_window"]
    rope = dec.get("rope_scaling") or dec.get("rope_parameters") or {}
    refusals = [
        (not isinstance(dec.get("codebook_dim"), int) or dec["codebook_dim"] < 2,
         "codebook_dim is missing or not an int of at least 2 (the decoder reads it)"),
        (not isinstance(window, int) or isinstance(window, bool) or window < 1,
         f"sliding_window {window!r}: upstream's decoder needs a window (its layers are all "
         "sliding-window attention)"),
        (not isinstance(dec["num_quantizers"], int) or dec["num_quantizers"] <= SEMANTIC_CODEBOOKS,
         f"num_quantizers {dec['num_quantizers']!r}: the split RVQ needs more than "
         f"{SEMANTIC_CODEBOOKS}"),
        (rope.get("rope_type", rope.get("type", "default")) != "default",
         f"rope_scaling {rope!r}: only default RoPE is exported"),
        (not isinstance(dec["hidden_act"], str) or dec["hidden_act"] not in ACT2FN,
         f"hidden_act {dec['hidden_act']!r} is no activation transformers knows"),
    ]  # fmt: skip
    for refused, why in refusals:
        if refused:
            raise CheckpointError(f"{WHERE}{why}")
    for key in SIZES:
        if not _positive_int(dec[key]):
            raise CheckpointError(f"{WHERE}{key} {dec[key]!r} is not a positive int")
    for key in ("upsample_rates", "upsampling_ratios"):
        if not isinstance(dec[key], list) or not all(_positive_int(r) for r in dec[key]):
            raise CheckpointError(f"{WHERE}{key} {dec[key]!r} is not a list of positive ints")
    return dec


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def transformer_config(dec: dict[str, Any]) -> Qwen3OmniMoeCode2WavConfig:
    """An Omni code2wav config carrying the Qwen3-TTS decoder's widths: ``hidden_size`` is the
    transformer's (the upsampling and decoder widths are passed to their modules explicitly).
    A value of the wrong kind is a CheckpointError naming decoder_config."""
    try:
        return _omni_config(dec)
    except Exception as e:  # transformers' strict config raises its own types
        message = " ".join(str(e).split()) or type(e).__name__
        raise CheckpointError(f"{WHERE[:-1]}: {message}") from None


def _omni_config(dec: dict[str, Any]) -> Qwen3OmniMoeCode2WavConfig:
    return Qwen3OmniMoeCode2WavConfig(
        codebook_size=dec["codebook_size"],
        hidden_size=dec["hidden_size"],
        head_dim=dec.get("head_dim", dec["hidden_size"] // dec["num_attention_heads"]),
        max_position_embeddings=dec["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": float(dec.get("rope_theta", 1e4))},
        num_attention_heads=dec["num_attention_heads"],
        num_key_value_heads=dec["num_key_value_heads"],
        attention_bias=dec.get("attention_bias", False),
        sliding_window=dec["sliding_window"],
        intermediate_size=dec["intermediate_size"],
        hidden_act=dec["hidden_act"],
        layer_scale_initial_scale=dec.get("layer_scale_initial_scale", 0.01),
        rms_norm_eps=dec["rms_norm_eps"],
        num_hidden_layers=dec["num_hidden_layers"],
        num_quantizers=dec["num_quantizers"],
        upsample_rates=list(dec["upsample_rates"]),
        upsampling_ratios=list(dec["upsampling_ratios"]),
        decoder_dim=dec["decoder_dim"],
        attention_dropout=dec.get("attention_dropout", 0.0),
    )


class _Codebook(nn.Module):
    """Upstream's EuclideanCodebook, decode side: the table is the running sum over usage."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, D, T]
        # from the weights alone: a build stores the table, folded (memory.folded_code2wav)
        table = self.embedding_sum / self.cluster_usage.clamp(min=CODEBOOK_EPSILON)[:, None]
        return F.embedding(codes, table).transpose(1, 2)


class _CodebookStack(nn.Module):
    """Holds ``layers`` so the names match upstream's ``vq.layers.<i>._codebook``."""

    def __init__(self, count: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Module() for _ in range(count))
        for layer in self.layers:
            layer._codebook = _Codebook(size, dim)


class _ResidualGroup(nn.Module):
    """One of upstream's ResidualVectorQuantizer groups: sum of its codebooks, 1x1 projection."""

    def __init__(self, count: int, size: int, dim: int, out_dim: int) -> None:
        super().__init__()
        self.vq = _CodebookStack(count, size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # [B, K, T] -> [B, out_dim, T]
        total = self.vq.layers[0]._codebook(codes[:, 0])
        for i in range(1, len(self.vq.layers)):
            total = total + self.vq.layers[i]._codebook(codes[:, i])
        return self.output_proj(total)


class _SplitQuantizer(nn.Module):
    def __init__(self, num_quantizers: int, size: int, codebook_dim: int) -> None:
        super().__init__()
        half = codebook_dim // 2
        self.rvq_first = _ResidualGroup(SEMANTIC_CODEBOOKS, size, half, codebook_dim)
        self.rvq_rest = _ResidualGroup(
            num_quantizers - SEMANTIC_CODEBOOKS, size, half, codebook_dim
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        first = self.rvq_first(codes[:, :SEMANTIC_CODEBOOKS])
        return first + self.rvq_rest(codes[:, SEMANTIC_CODEBOOKS:])


def _trans_conv(in_dim: int, out_dim: int, kernel: int, stride: int) -> nn.Module:
    """Omni's transposed conv, trimming ``kernel - stride`` from the right only (as upstream)."""
    conv = hf.Qwen3OmniMoeCausalTransConvNet(in_dim, out_dim, kernel, stride)
    conv.left_pad = 0
    return conv


class Qwen3TTSCode2Wav(nn.Module):
    """Upstream's decoder forward with Omni's building blocks; parameter names as upstream's."""

    def __init__(self, dec: dict[str, Any]) -> None:
        super().__init__()
        dec = decoder_settings(dec)
        cfg = transformer_config(dec)
        codebook_dim, latent = dec["codebook_dim"], dec["latent_dim"]
        self.num_quantizers = cfg.num_quantizers
        self.samples_per_frame = math.prod(cfg.upsampling_ratios) * math.prod(cfg.upsample_rates)
        self.quantizer = _SplitQuantizer(cfg.num_quantizers, cfg.codebook_size, codebook_dim)
        self.pre_conv = hf.Qwen3OmniMoeCausalConvNet(codebook_dim, latent, kernel_size=3)
        self.pre_transformer = hf.Qwen3OmniMoeCode2WavTransformerModel(cfg)
        self.pre_transformer.input_proj = nn.Linear(latent, cfg.hidden_size)
        self.pre_transformer.output_proj = nn.Linear(cfg.hidden_size, latent)
        self.upsample = nn.ModuleList(
            nn.ModuleList([_trans_conv(latent, latent, f, f), hf.Qwen3OmniMoeConvNeXtBlock(latent)])
            for f in cfg.upsampling_ratios
        )
        blocks = [
            hf.Qwen3OmniMoeCode2WavDecoderBlock(cfg, i) for i in range(len(cfg.upsample_rates))
        ]
        for block in blocks:
            block.block[1].left_pad = 0
        out_dim = cfg.decoder_dim // 2 ** len(cfg.upsample_rates)
        self.decoder = nn.ModuleList(
            [
                hf.Qwen3OmniMoeCausalConvNet(latent, cfg.decoder_dim, 7),
                *blocks,
                hf.Qwen3OmniMoeSnakeBeta(out_dim),
                hf.Qwen3OmniMoeCausalConvNet(out_dim, 1, 7),
            ]
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int64 [B, num_quantizers, T] (upstream's decoder layout) -> float32 [B, T*1920]."""
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(f"expected {self.num_quantizers} codebooks, got {codes.shape[1]}")
        pre = self.pre_transformer
        x = self.pre_conv(self.quantizer(codes)).transpose(1, 2)
        # positions [B, T], not HF's default [1, T]: the exported ONNX RotaryEmbedding fails in
        # ORT for B > 1 when cos/sin have batch 1 (same values either way in torch)
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device).unsqueeze(0).expand(b, t)
        x = pre(inputs_embeds=pre.input_proj(x), position_ids=positions).last_hidden_state
        x = pre.output_proj(x).permute(0, 2, 1)
        for blocks in self.upsample:
            for block in blocks:
                x = block(x)
        for block in self.decoder:
            x = block(x)
        return x.clamp(min=-1, max=1).squeeze(1)


def load_decoder(speech_tokenizer_dir: Path) -> Qwen3TTSCode2Wav:
    """The decoder of a ``speech_tokenizer/`` folder, fp32, eval mode. Strict: every ``decoder.*``
    tensor but the encoder-side ``UNUSED_SUFFIXES`` must be used and none may be missing."""
    ckpt = open_checkpoint(speech_tokenizer_dir)
    dec = decoder_settings(ckpt.config.get("decoder_config"))
    with torch.device("meta"):  # names only: no memory, no init
        expected = set(Qwen3TTSCode2Wav(dec).state_dict())
    found = {n[len(PREFIX) :] for n in ckpt.names(PREFIX)} - set(UNUSED_SUFFIXES)
    missing, extra = sorted(expected - found), sorted(found - expected)
    if missing or extra:
        raise CheckpointError(
            f"{ckpt.path}: decoder weights do not match Qwen3-TTS's code2wav: "
            f"missing {[PREFIX + n for n in missing]}, unexpected {[PREFIX + n for n in extra]}"
        )
    return load_hf_module(Qwen3TTSCode2Wav, dec, ckpt.tensor, PREFIX).eval()


class Code2WavGraph(omni.Code2WavGraph):
    """The exported graph: Omni's (plugin attention, left-padded causal convs), with the split
    RVQ, ``pre_conv`` and the transformer's input / output projections of this decoder."""

    def __init__(self, decoder: Qwen3TTSCode2Wav) -> None:
        super().__init__(decoder, decoder.pre_transformer.config)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        m = self.model
        pre = m.pre_transformer
        x = omni._apply(m.pre_conv, m.quantizer(codes)).transpose(1, 2)  # [B, T, latent]
        h = self._transformer(pre, pre.input_proj(x))
        return self._vocode(pre.output_proj(h).permute(0, 2, 1))


def export_code2wav(decoder: Qwen3TTSCode2Wav, path: Path) -> Path:
    """codes int64 [B, 16, T] -> waveform float32 [B, 1, T*1920] (the code2wav runner's
    contract, Omni's too), batch and frames dynamic (plugin
    op not yet lowered); returns the model path. Runs at T = 1 too."""
    cfg = decoder.pre_transformer.config
    graph = Code2WavGraph(decoder.eval())
    return omni.export_graph(graph, cfg.codebook_size, decoder.num_quantizers, path)


ENGINE = omni.ENGINE
PRE_CONV_FRAMES = 2  # pre_conv: a causal conv of kernel 3 sees the 2 frames before


def samples_per_frame(dec: dict[str, Any]) -> int:
    return math.prod(dec["upsampling_ratios"]) * math.prod(dec["upsample_rates"])


def code2wav_engine_config(
    tokenizer_cfg: dict[str, Any], max_frames: int = omni.MAX_FRAMES
) -> dict[str, Any]:
    """config.json fields the code2wav runner reads, from ``speech_tokenizer/config.json``.

    Windows are upstream's ``chunked_decode``: 300 frames with 25 frames of left context. Nothing
    is trimmed (the transposed convs trim on the right inside the model: n frames, n*1920
    samples), so a window's samples are final as soon as it is decoded."""
    dec = decoder_settings(tokenizer_cfg.get("decoder_config"))
    per_frame = samples_per_frame(dec)
    upsample = int(tokenizer_cfg.get("decode_upsample_rate", per_frame))
    if upsample != per_frame:
        raise CheckpointError(
            f"speech_tokenizer/config.json: decode_upsample_rate {upsample} is not the "
            f"decoder's {per_frame} samples per frame (decoder_config.upsampling_ratios x "
            "upsample_rates)"
        )
    return {
        "component": "code2wav",
        "model_type": "qwen3_tts",
        "engine": ENGINE,
        "dtype": "float32",
        # the CUDA provider may run its float32 convolutions on TF32 tensor cores: the audio
        # stays within ~1% of the peak of exact float32 (tests/test_gpu.py), several times
        # faster; decoders run exact float32 (runtime/engine.py)
        "tf32": True,
        "inputs": {omni.INPUT: "int64 [batch, num_quantizers, frames]"},
        "outputs": {omni.OUTPUT: "float32 [batch, 1, frames*samples_per_frame]"},
        "num_quantizers": int(dec["num_quantizers"]),
        "codebook_size": int(dec["codebook_size"]),
        "samples_per_frame": per_frame,
        "trim": 0,
        "sample_rate": int(tokenizer_cfg.get("output_sample_rate", 24000)),
        "window_frames": omni.WINDOW_FRAMES,
        "left_context_frames": omni.LEFT_CONTEXT_FRAMES,
        "receptive_field_frames": omni.receptive_field_frames(transformer_config(dec))
        + PRE_CONV_FRAMES,
        "max_frames": max_frames,
        "profiles": {"batch": [1, 1], "frames": [1, max_frames]},
    }


class StreamGraph(stream.StreamGraph):
    """The stateful step (export/speech/code2wav_stream.py) of this decoder: its
    split RVQ and causal ``pre_conv`` (2 frames of state) before the transformer, the
    projections around it; its transposed convs trim on the right only, so a stream's samples
    are all audio (``delay_samples`` 0)."""

    def __init__(self, decoder: Qwen3TTSCode2Wav) -> None:
        super().__init__(decoder.eval(), decoder.pre_transformer.config)

    def _hidden(self, c: Any, codes: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = self._conv(c, m.pre_conv, m.quantizer(codes)).transpose(1, 2)  # [B, n, latent]
        return m.pre_transformer.input_proj(x)

    def _latent(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.pre_transformer.output_proj(h).permute(0, 2, 1)


def export_stream(decoder: Qwen3TTSCode2Wav, path: Path) -> Path:
    """The stateful step engine's graph (code2wav_stream.export_stream)."""
    cfg = decoder.pre_transformer.config
    return stream.export_stream(StreamGraph(decoder), cfg.codebook_size, path)


def stream_engine_config(tokenizer_cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json fields of the step engine, from ``speech_tokenizer/config.json`` (its state
    layout from a dry run of the decoder built on the meta device: no weights read)."""
    base = code2wav_engine_config(tokenizer_cfg)
    with torch.device("meta"):
        decoder = Qwen3TTSCode2Wav(decoder_settings(tokenizer_cfg.get("decoder_config")))
    return stream.stream_engine_config(StreamGraph(decoder), base)
