"""Qwen3-TTS's 12 Hz speech-tokenizer encoder: 24 kHz audio [B, N] -> codes [B, ceil(N/1920), 16].

Upstream (qwen-tts 0.1.1) makes it a transformers ``MimiModel`` (``Qwen3TTSTokenizerV2Encoder``,
decoder parts set to None) whose ``encode`` runs the SEANet encoder, the encoder transformer,
the stride-2 ``downsample`` and the split RVQ (1 semantic + 31 acoustic codebooks), of which
``Qwen3TTSTokenizerV2Model.encode`` keeps the first ``encoder_valid_num_quantizers`` (16).
transformers 5 split Mimi into ``MimiEncoderModel`` / ``MimiDecoderModel`` (``encoder_seanet``
..., ``MimiModel``'s old attributes now read-only properties), so this module holds 5.x's
building blocks under upstream's 4.57 names (``encoder.<name>`` in ``model.safetensors``) and
runs the encode path itself. The blocks compute the same in 4.57.3 and 5.x; kept on purpose,
as upstream on 4.57.3 computes it:

- causal convs: left pad ``kernel - stride`` (zeros; edge values for ``downsample``), right pad
  to a whole stride (same modes), so N samples give ceil(N/960) transformer steps and
  ceil(N/1920) frames;
- the encoder transformer attends to the whole causal past: 4.57.3's eager and SDPA Mimi
  attention never apply ``sliding_window`` (its flash-attention class did; the tokenizer is
  loaded without it), while 5.x masks a window. ``window`` stays None for upstream's codes;
- each codebook's table is ``embed_sum / clamp(cluster_usage, 1e-5)``, a code is the nearest
  entry by ``torch.cdist`` (first index on ties), each pick is subtracted from the residual,
  and the acoustic group starts again from the latents (Mimi's split RVQ).

Upstream trims each row's codes to ``ceil(valid_samples / 1920)`` of a right-padded batch: for a
row that is not padded that is every frame, so this module returns them all. A zero-padded row
gets upstream's batched codes (its last frames can differ from encoding it alone, upstream too:
the deeper convs pad with zeros, not with what zero audio becomes), so encode rows of one length.

One graph for every length: the wav is zero-padded to whole frames up front, so each stage's
length is the frame count times a constant, and a strided conv's input is cut back to upstream's
valid length by a mask (zeros, or the last valid step for ``downsample``) instead of a pad, which
gives the same numbers for the steps upstream computes. Padding per layer instead makes the
exporter carry nested ceil expressions through every shape (a ~30 s export).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.mimi import modeling_mimi as hf
from transformers.models.mimi.configuration_mimi import MimiConfig

from edgeomni.export.common.checkpoint import CheckpointError, open_checkpoint
from edgeomni.export.common.hf_module import load_hf_module
from edgeomni.export.common.onnx_export import export_onnx

PREFIX = "encoder."
ENGINE = "speech_tokenizer_encoder.onnx"
INPUT = "wav"
OUTPUT = "codes"
SEMANTIC = "quantizer.semantic_residual_vector_quantizer."
ACOUSTIC = "quantizer.acoustic_residual_vector_quantizer."
# Dequantization back to the latents' width: encoding reads only input_proj and the codebooks.
UNUSED_SUFFIXES = (SEMANTIC + "output_proj.weight", ACOUSTIC + "output_proj.weight")
CDIST_CLAMP = 1e-30  # torch.cdist's clamp before the square root (matmul form)
VALID_QUANTIZERS = 16  # Qwen3TTSTokenizerV2Config's default encoder_valid_num_quantizers
WHERE = "speech_tokenizer/config.json"
INPUT_RATE = 24000  # Qwen3TTSTokenizerV2Config's default input_sample_rate


def _acoustic_layer(name: str) -> int | None:
    """The index of an acoustic codebook tensor (``...layers.<i>.codebook.*``), else None."""
    if not name.startswith(ACOUSTIC + "layers."):
        return None
    return int(name[len(ACOUSTIC + "layers.") :].split(".", 1)[0])


def mimi_config(tokenizer_cfg: dict[str, Any]) -> MimiConfig:
    """transformers 5's MimiConfig from the checkpoint's 4.57-style ``encoder_config``, with only
    the kept quantizers (the RVQ is sequential: later codebooks never change earlier codes).

    Every key upstream's config class accepts is read or refused here, naming it (a
    CheckpointError), so a build preflight catches what the export could not do.
    ``sliding_window`` is dropped: upstream's attention never applies it (module docstring),
    and 5.x's strict config refuses the None that 4.57 takes."""
    enc = tokenizer_cfg.get("encoder_config")
    if not isinstance(enc, dict):
        raise CheckpointError(f"{WHERE}: no encoder_config (the codec's encoder)")
    keys = set(MimiConfig.__dataclass_fields__) - {"num_quantizers", "rope_parameters"}
    fields = {k: v for k, v in enc.items() if k in keys - {"sliding_window"} and v is not None}
    if "codebook_dim" in enc and enc["codebook_dim"] is None:  # 4.57: None means hidden_size
        fields["codebook_dim"] = fields.get("hidden_size", MimiConfig.hidden_size)
    theta = enc.get("rope_theta", 1e4)
    try:
        full = MimiConfig(
            **fields,
            num_quantizers=enc.get("num_quantizers", MimiConfig.num_quantizers),
            rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
            frame_rate=enc.get("frame_rate", enc.get("_frame_rate")),  # 4.57: _frame_rate
        )
    except Exception as e:  # transformers' strict config raises its own types
        raise CheckpointError(f"{WHERE}: encoder_config: {_first_line(e)}") from None
    _refuse_unsupported(full, tokenizer_cfg)
    kept = _kept_quantizers(tokenizer_cfg, full)
    cfg = MimiConfig(**{**full.to_dict(), "num_quantizers": kept, "frame_rate": full.frame_rate})
    cfg._attn_implementation = "eager"  # a plain additive mask: exports to ONNX as it is
    return cfg


def latent_stride(cfg: MimiConfig) -> int:
    """The SEANet frames a codec frame takes (MimiConfig.latent_stride where transformers has
    it; versions before it lack the property, and their configs give the same two rates)."""
    return int(cfg.encodec_frame_rate / cfg.frame_rate)


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(e).__name__


def _kept_quantizers(tokenizer_cfg: dict[str, Any], full: MimiConfig) -> int:
    """``encoder_valid_num_quantizers`` (upstream's default 16): the codebooks a frame keeps,
    more than the semantic ones (5.x's Mimi needs an acoustic one) and at most the RVQ's."""
    kept = tokenizer_cfg.get("encoder_valid_num_quantizers", VALID_QUANTIZERS)
    if not isinstance(kept, int) or not full.num_semantic_quantizers < kept <= full.num_quantizers:
        raise CheckpointError(
            f"{WHERE}: encoder_valid_num_quantizers {kept!r} is not within the encoder's RVQ "
            f"(more than num_semantic_quantizers {full.num_semantic_quantizers}, at most "
            f"num_quantizers {full.num_quantizers})"
        )
    return kept


def _refuse_unsupported(cfg: MimiConfig, tokenizer_cfg: dict[str, Any]) -> None:
    """What upstream's encoder takes but this export does not compute as upstream does (or
    what upstream's encode itself fails on), each naming its key."""
    refusals = [
        (not cfg.use_causal_conv, "use_causal_conv false: only causal convs are exported"),
        (cfg.pad_mode != "constant",
         f"pad_mode {cfg.pad_mode!r}: only 'constant' padding is exported"),
        (cfg.hidden_act not in ACT2FN,
         f"hidden_act {cfg.hidden_act!r} is no activation transformers knows"),
        (cfg.audio_channels != 1,
         f"audio_channels {cfg.audio_channels}: upstream encodes mono audio only"),
        (cfg.frame_rate == cfg.encodec_frame_rate,
         f"_frame_rate {cfg.frame_rate} is the SEANet's own rate: no downsample stage, which "
         "this export does not handle"),
        (latent_stride(cfg) < 1 or cfg.frame_rate * latent_stride(cfg) != cfg.encodec_frame_rate,
         f"_frame_rate {cfg.frame_rate} does not divide the SEANet's rate "
         f"{cfg.encodec_frame_rate}: no whole downsample stride"),
        (cfg.vector_quantization_hidden_dimension != cfg.codebook_dim,
         f"vector_quantization_hidden_dimension {cfg.vector_quantization_hidden_dimension} is "
         f"not codebook_dim {cfg.codebook_dim}: the codebooks could not be searched"),
    ]  # fmt: skip
    for refused, why in refusals:
        if refused:
            raise CheckpointError(f"{WHERE}: encoder_config.{why}")
    per_frame = math.prod(cfg.upsampling_ratios) * latent_stride(cfg)
    rate = tokenizer_cfg.get("encode_downsample_rate", per_frame)
    if rate != per_frame:
        raise CheckpointError(
            f"{WHERE}: encode_downsample_rate {rate} is not the encoder's {per_frame} samples "
            "per frame"
        )


def _nearest(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """argmin over ``torch.cdist(x, table)`` as torch computes it for more than 25 rows (with
    2048 entries: always): one matmul of ``[-2x, |x|^2, 1]`` by ``[e, 1, |e|^2]``, clamped,
    square-rooted; bit-equal to cdist in torch. A tie keeps the first index (as ONNX ArgMin)."""
    x_norm = x.pow(2).sum(-1, keepdim=True)
    t_norm = table.pow(2).sum(-1, keepdim=True)
    lhs = torch.cat([x * -2, x_norm, torch.ones_like(x_norm)], dim=-1)
    rhs = torch.cat([table, torch.ones_like(t_norm), t_norm], dim=-1)
    return (lhs @ rhs.T).clamp(min=CDIST_CLAMP).sqrt().argmin(dim=-1)


def _rvq_encode(rvq: hf.MimiResidualVectorQuantizer, latents: torch.Tensor) -> list[torch.Tensor]:
    """Mimi's ResidualVectorQuantizer.encode: latents [B, D, T] -> one [B, T] code per layer."""
    # no input_proj when vector_quantization_hidden_dimension == hidden_size: Mimi's identity
    projected = latents if rvq.input_proj is None else rvq.input_proj(latents)
    # [B, T, d]: the matmul folds B into its rows, as Mimi's [B*T, d] reshape before cdist
    residual = projected.transpose(1, 2)
    codes = []
    # the tables come from the weights alone: a build stores them, folded, in place of the
    # codebooks (memory.folded_speech_encoder counts them so)
    for layer in rvq.layers:
        book = layer.codebook
        table = book.embed_sum / book.cluster_usage.clamp(min=book.epsilon)[:, None]
        index = _nearest(residual, table)
        residual = residual - F.embedding(index, table)
        codes.append(index)
    return codes


def _conv(conv: hf.MimiConv1d, x: torch.Tensor, valid: Any) -> tuple[torch.Tensor, Any]:
    """MimiConv1d's causal forward on a whole-frames input whose first ``valid`` steps are
    upstream's: steps past them become upstream's right pad (zeros, or the last valid step in
    ``replicate`` mode), the left pad is upstream's. Returns the output and its valid steps."""
    c = conv.conv
    stride = c.stride[0]
    kernel = (c.kernel_size[0] - 1) * c.dilation[0] + 1
    if stride > 1:  # stride 1 has no right pad: its valid outputs never read past ``valid``
        steps = torch.arange(x.shape[-1], device=x.device)
        if conv.pad_mode == "replicate":
            x = x.index_select(-1, steps.clamp(max=valid - 1))
        else:
            x = torch.where(steps < valid, x, 0.0)
    x = F.pad(x, (kernel - stride, 0), mode=conv.pad_mode)
    return c(x), (valid + stride - 1) // stride  # ceil; not -(-a // b): ONNX Div truncates


class Qwen3TTSSpeechEncoder(nn.Module):
    """Mimi's encode path under upstream's names: ``encoder`` (SEANet), ``encoder_transformer``,
    ``downsample``, ``quantizer`` (split RVQ with only the kept codebooks)."""

    def __init__(self, tokenizer_cfg: dict[str, Any]) -> None:
        super().__init__()
        cfg = mimi_config(tokenizer_cfg)  # refuses what this module cannot compute
        self.num_quantizers = cfg.num_quantizers
        self.samples_per_frame = math.prod(cfg.upsampling_ratios) * latent_stride(cfg)
        # None: upstream's full causal attention (see the module docstring)
        self.window: int | None = None
        self.encoder = hf.MimiEncoder(cfg)
        self.encoder_transformer = hf.MimiTransformerModel(cfg)
        self.downsample = hf.MimiConv1d(
            cfg,
            cfg.hidden_size,
            cfg.hidden_size,
            kernel_size=2 * latent_stride(cfg),
            stride=latent_stride(cfg),
            bias=False,
            pad_mode="replicate",
        )
        self.quantizer = hf.MimiSplitResidualVectorQuantizer(cfg)
        for rvq in self._groups():
            rvq.output_proj = None  # UNUSED_SUFFIXES: dequantization only

    def _groups(self) -> tuple[hf.MimiResidualVectorQuantizer, hf.MimiResidualVectorQuantizer]:
        q = self.quantizer
        return q.semantic_residual_vector_quantizer, q.acoustic_residual_vector_quantizer

    def _seanet(self, x: torch.Tensor, valid: Any) -> tuple[torch.Tensor, Any]:
        for layer in self.encoder.layers:
            if isinstance(layer, hf.MimiConv1d):
                x, valid = _conv(layer, x, valid)
            elif isinstance(layer, hf.MimiResnetBlock):  # stride-1 convs: ``valid`` unchanged
                h = x
                for sub in layer.block:
                    h = _conv(sub, h, valid)[0] if isinstance(sub, hf.MimiConv1d) else sub(h)
                short = layer.shortcut
                x = (_conv(short, x, valid)[0] if isinstance(short, hf.MimiConv1d) else x) + h
            else:
                x = layer(x)
        return x, valid

    def _transformer(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        b, t, _ = x.shape
        steps = torch.arange(t, device=x.device)
        positions = steps.unsqueeze(0).expand(b, t)
        allowed = steps[None, :] <= steps[:, None]
        if self.window is not None:  # transformers 5's sliding window (not upstream's)
            allowed = allowed & (steps[:, None] - steps[None, :] < self.window)
        mask = torch.zeros(t, t, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]
        model = self.encoder_transformer
        rope = model.rotary_emb(x, positions)
        for layer in model.layers:
            x = layer(x, attention_mask=mask, position_embeddings=rope)
        return x

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        """wav float32 [B, N] at 24 kHz -> codes int64 [B, ceil(N / 1920), num_quantizers]."""
        n = wav.shape[-1]
        frames = (n + self.samples_per_frame - 1) // self.samples_per_frame
        x = F.pad(wav, (0, frames * self.samples_per_frame - n)).unsqueeze(1)
        x, valid = self._seanet(x, n)  # [B, H, 2 * frames], ceil(N / 960) of them upstream's
        # causal: the steps past ``valid`` never reach the valid ones
        x = self._transformer(x.transpose(1, 2)).transpose(1, 2)
        latents, _ = _conv(self.downsample, x, valid)  # [B, H, frames]
        semantic, acoustic = (_rvq_encode(rvq, latents) for rvq in self._groups())
        return torch.stack(semantic + acoustic, dim=-1)


def load_speech_encoder(speech_tokenizer_dir: Path) -> Qwen3TTSSpeechEncoder:
    """The encoder of a ``speech_tokenizer/`` folder, fp32, eval mode. Strict: every
    ``encoder.*`` tensor is loaded but the dequantizing ``UNUSED_SUFFIXES`` and the acoustic
    codebooks past the kept ones, and none may be missing or mis-shaped."""
    ckpt = open_checkpoint(speech_tokenizer_dir)
    with torch.device("meta"):  # names only: no memory, no init
        meta = Qwen3TTSSpeechEncoder(ckpt.config)
    expected = set(meta.state_dict())
    kept_acoustic = len(meta._groups()[1].layers)
    found = {n[len(PREFIX) :] for n in ckpt.names(PREFIX)} - set(UNUSED_SUFFIXES)
    found = {n for n in found if (_acoustic_layer(n) or 0) < kept_acoustic}
    missing, extra = sorted(expected - found), sorted(found - expected)
    if missing or extra:
        raise CheckpointError(
            f"{ckpt.path}: encoder weights do not match Qwen3-TTS's speech tokenizer: "
            f"missing {[PREFIX + n for n in missing]}, unexpected {[PREFIX + n for n in extra]}"
        )
    try:
        module = load_hf_module(Qwen3TTSSpeechEncoder, ckpt.config, ckpt.tensor, PREFIX)
    except CheckpointError:
        raise
    except ValueError as e:  # load_hf_module's word for a mis-shaped tensor
        raise CheckpointError(f"{ckpt.path}: {e}") from None
    return module.eval()


def export_speech_encoder(module: Qwen3TTSSpeechEncoder, path: Path) -> Path:
    """wav float32 [batch, samples] -> codes int64 [batch, frames, 16], frames =
    ceil(samples / 1920), batch and samples dynamic (any samples >= 1); returns the model path.
    A plain ONNX graph: no plugin ops."""
    import onnx
    from torch.export import Dim

    wav = torch.randn(2, 5 * module.samples_per_frame + 123) * 0.1
    # min 2 frames: the exporter's 0/1 specialisation guards "frames != 1" anyway (the graph is
    # the same for 1 frame; the tests run it from 1 sample up)
    shapes = ({0: Dim("batch"), 1: Dim("samples", min=module.samples_per_frame + 1)},)
    path = export_onnx(
        module.eval(),
        (wav,),
        Path(path),
        input_names=[INPUT],
        output_names=[OUTPUT],
        dynamic_shapes=shapes,
    )
    model = onnx.load(str(path), load_external_data=False)
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "frames"  # not the formula
    onnx.save(model, str(path))
    return path


def engine_config(tokenizer_cfg: dict[str, Any]) -> dict[str, Any]:
    """What a runtime needs around the engine (``tokenizer_cfg``: speech_tokenizer/config.json):
    the input rate, samples per code frame (frames = ceil(samples / it)), codebooks per frame."""
    cfg = mimi_config(tokenizer_cfg)  # upstream's defaults for the keys a config leaves out
    return {
        "sample_rate": int(tokenizer_cfg.get("input_sample_rate", INPUT_RATE)),
        "samples_per_frame": math.prod(cfg.upsampling_ratios) * latent_stride(cfg),
        "num_quantizers": cfg.num_quantizers,
    }
