"""Qwen3-TTS Base's speaker encoder (ECAPA-TDNN x-vector): log-mel [B, frames, 128] -> [B, enc_dim].

A port of qwen-tts 0.1.1's ``Qwen3TTSSpeakerEncoder`` (transformers has no Qwen3-TTS), with
upstream's submodule names, so ``speaker_encoder.<name>`` tensors of the checkpoint's
``model.safetensors`` load one to one. Upstream's behaviour kept on purpose:

- every conv is ``padding="same", padding_mode="reflect"`` (TimeDelayNetBlock, the SE and pooling
  1x1 convs, ``fc``): a reflect pad needs more frames than it pads, so the encoder needs at least
  ``min_frames(cfg)`` frames (5 for the release's dilations 1..4 with kernel 3);
- ``AttentiveStatisticsPooling`` builds a length mask, but always from the input's own length
  (``lengths = ones * seq_length``): the mask is all ones, ``mask / total`` is ``1 / frames``
  and the ``-inf`` fill never fires. The port computes that directly, so the exported graph is
  the same computation for every frame count; a batch must be rows of one length (no padding);
- the std clamps the variance at 1e-12 before the square root.

The mel front end that makes the input (upstream's ``mel_spectrogram`` as
``extract_speaker_embedding`` calls it) is runtime/families/qwen3_tts/speaker_mel.py; the
values it needs are ``engine_config``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgeomni.export.common.checkpoint import CheckpointError, open_checkpoint

PREFIX = "speaker_encoder."
ENGINE = "speaker_encoder.onnx"
INPUT = "mels"
OUTPUT = "speaker_embedding"
# extract_speaker_embedding's mel_spectrogram arguments (hard-coded upstream, not in the config)
N_FFT, HOP_SIZE, WIN_SIZE, FMIN, FMAX, N_MELS = 1024, 256, 1024, 0, 12000, 128
SAMPLE_RATE = 24000
STD_EPSILON = 1e-12  # AttentiveStatisticsPooling.eps
# Qwen3TTSSpeakerEncoderConfig's defaults, for keys a config.json leaves out
DEFAULTS: dict[str, Any] = {
    "mel_dim": 128,
    "enc_dim": 1024,
    "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 128,
    "enc_res2net_scale": 8,
    "enc_se_channels": 128,
    "sample_rate": 24000,
}


def _conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    """Upstream's conv: 'same' length through reflect padding."""
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TimeDelayNetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, kernel_size, dilation)
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.conv(x))


class Res2NetBlock(nn.Module):
    """Channel groups in series: group i (i >= 2) sees its input plus group i-1's output."""

    def __init__(self, cin: int, cout: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(
            TimeDelayNetBlock(cin // scale, cout // scale, kernel_size, dilation)
            for _ in range(scale - 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outputs = [parts[0]]
        out = self.blocks[0](parts[1])
        outputs.append(out)
        for i in range(2, self.scale):
            out = self.blocks[i - 1](parts[i] + out)
            outputs.append(out)
        return torch.cat(outputs, dim=1)


class SqueezeExcitationBlock(nn.Module):
    def __init__(self, cin: int, se_channels: int, cout: int) -> None:
        super().__init__()
        self.conv1 = _conv(cin, se_channels)
        self.relu = nn.ReLU()
        self.conv2 = _conv(se_channels, cout)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.relu(self.conv1(x.mean(dim=2, keepdim=True)))
        return x * self.sigmoid(self.conv2(gate))


class SqueezeExcitationRes2NetBlock(nn.Module):
    def __init__(
        self, cin: int, cout: int, scale: int, se_channels: int, kernel_size: int, dilation: int
    ) -> None:
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, cout, scale, kernel_size, dilation)
        self.tdnn2 = TimeDelayNetBlock(cout, cout, 1, 1)
        self.se_block = SqueezeExcitationBlock(cout, se_channels, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tdnn2(self.res2net_block(self.tdnn1(x)))
        return self.se_block(h) + x


class AttentiveStatisticsPooling(nn.Module):
    """Upstream's pooling with its (always all-ones) length mask folded away: weights 1 / frames
    for the context statistics, then a softmax over frames for the pooled mean and std."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1, 1)
        self.tanh = nn.Tanh()
        self.conv = _conv(attention_channels, channels)

    @staticmethod
    def _statistics(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        var = (weights * (x - mean.unsqueeze(2)).pow(2)).sum(2)
        return mean, torch.sqrt(var.clamp(STD_EPSILON))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, 2C, 1]
        frames = x.shape[2]
        uniform = torch.ones_like(x[:, :1]) / frames  # upstream's mask / mask.sum(): [B, 1, T]
        mean, std = self._statistics(x, uniform)
        context = torch.cat(
            [x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1
        )
        attention = torch.softmax(self.conv(self.tanh(self.tdnn(context))), dim=2)
        mean, std = self._statistics(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class Qwen3TTSSpeakerEncoder(nn.Module):
    """ECAPA-TDNN: a TDNN, SE-Res2Net blocks, multi-layer aggregation, attentive pooling, fc."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        cfg = {**DEFAULTS, **cfg}
        channels, kernels = list(cfg["enc_channels"]), list(cfg["enc_kernel_sizes"])
        dilations = list(cfg["enc_dilations"])
        if not len(channels) == len(kernels) == len(dilations):
            raise ValueError("enc_channels, enc_kernel_sizes and enc_dilations differ in length")
        self.mel_dim, self.enc_dim = int(cfg["mel_dim"]), int(cfg["enc_dim"])
        self.blocks = nn.ModuleList(
            [TimeDelayNetBlock(self.mel_dim, channels[0], kernels[0], dilations[0])]
        )
        for i in range(1, len(channels) - 1):
            self.blocks.append(
                SqueezeExcitationRes2NetBlock(
                    channels[i - 1],
                    channels[i],
                    scale=cfg["enc_res2net_scale"],
                    se_channels=cfg["enc_se_channels"],
                    kernel_size=kernels[i],
                    dilation=dilations[i],
                )
            )
        self.mfa = TimeDelayNetBlock(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentiveStatisticsPooling(channels[-1], cfg["enc_attention_channels"])
        self.fc = _conv(channels[-1] * 2, self.enc_dim)
        self.min_frames = min_frames(cfg)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """mels float32 [B, frames, mel_dim] (frames >= ``min_frames``) -> [B, enc_dim]."""
        h = mels.transpose(1, 2)
        hidden = []
        for block in self.blocks:
            h = block(h)
            hidden.append(h)
        h = self.mfa(torch.cat(hidden[1:], dim=1))
        return self.fc(self.asp(h)).squeeze(-1)


def check_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``speaker_encoder_config`` over upstream's defaults, refusing (a CheckpointError naming
    the key) what upstream's class builds but its forward cannot run: the SE-Res2Net blocks add
    their input back and split it into ``enc_res2net_scale`` groups, and the aggregation reads
    their outputs side by side; and mels other than upstream's fixed 128 bands at 24 kHz."""
    where = "config.json: speaker_encoder_config."
    cfg = {**DEFAULTS, **cfg}
    lists = ("enc_channels", "enc_kernel_sizes", "enc_dilations")
    if (
        not all(isinstance(cfg[k], list) and cfg[k] for k in lists)
        or len({len(cfg[k]) for k in lists}) != 1
    ):
        raise CheckpointError(f"{where}{', '.join(lists)} must be lists of one length")
    channels, scale = cfg["enc_channels"], cfg["enc_res2net_scale"]
    if len(channels) < 3 or len(set(channels[:-1])) != 1:
        raise CheckpointError(
            f"{where}enc_channels {channels}: needs at least 3 entries, all but the last equal "
            "(each SE-Res2Net block adds its input to its output)"
        )
    if channels[-1] != sum(channels[1:-1]):
        raise CheckpointError(
            f"{where}enc_channels {channels}: the last must be the sum of the SE-Res2Net "
            f"blocks' {sum(channels[1:-1])} (the aggregation concatenates them)"
        )
    if not isinstance(scale, int) or scale < 2 or channels[0] % scale:
        raise CheckpointError(
            f"{where}enc_res2net_scale {scale!r} must be at least 2 and divide enc_channels "
            f"{channels[0]}"
        )
    for key, fixed in (("mel_dim", N_MELS), ("sample_rate", SAMPLE_RATE)):
        if cfg[key] != fixed:
            raise CheckpointError(
                f"{where}{key} {cfg[key]!r}: upstream's extract_speaker_embedding makes its mels "
                f"with {fixed} whatever the config says"
            )
    return cfg


def min_frames(cfg: dict[str, Any]) -> int:
    """Fewest frames the encoder takes: each reflect pad (half of ``dilation * (kernel - 1)``,
    the larger half on the right) must be shorter than the sequence."""
    cfg = {**DEFAULTS, **cfg}
    pads = [
        d * (k - 1) - d * (k - 1) // 2
        for k, d in zip(cfg["enc_kernel_sizes"], cfg["enc_dilations"], strict=True)
    ]
    return max(pads) + 1


def load_speaker_encoder(checkpoint_dir: Path) -> Qwen3TTSSpeakerEncoder:
    """The speaker encoder of a Base checkpoint, float32, eval mode. Strict: every
    ``speaker_encoder.*`` tensor must be a parameter, every parameter must be there with its
    shape; anything else is a CheckpointError naming the tensors."""
    ckpt = open_checkpoint(checkpoint_dir)
    cfg = ckpt.config.get("speaker_encoder_config")
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{ckpt.path}/config.json: no speaker_encoder_config")
    with torch.device("meta"):  # names and shapes only; the tensors are assigned below
        module = Qwen3TTSSpeakerEncoder(check_config(cfg))
    expected = module.state_dict()
    found = {n[len(PREFIX) :] for n in ckpt.names(PREFIX)}
    missing, extra = sorted(set(expected) - found), sorted(found - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"{ckpt.path}: speaker encoder weights do not match Qwen3-TTS's: "
            f"missing {[PREFIX + n for n in missing]}, unexpected {[PREFIX + n for n in extra]}"
        )
    state = {}
    for name, param in expected.items():
        tensor = ckpt.tensor(PREFIX + name)
        if tuple(tensor.shape) != tuple(param.shape):
            raise CheckpointError(
                f"{ckpt.path}: {PREFIX}{name} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(param.shape)}"
            )
        state[name] = tensor.to(torch.float32).contiguous()
    module.load_state_dict(state, strict=True, assign=True)
    return module.eval()


def export_speaker_encoder(module: Qwen3TTSSpeakerEncoder, path: Path) -> Path:
    """``mels`` float32 [batch, frames, mel_dim] -> ``speaker_embedding`` float32
    [batch, enc_dim], batch and frames dynamic (frames >= ``module.min_frames``); returns the
    model path. Rows of a batch share one length: there is no padding mask (nor one upstream)."""
    from torch.export import Dim

    from edgeomni.export.common.onnx_export import export_onnx

    # example sizes >= 2 on dynamic axes (torch.export specialises size 1), frames above the
    # reflect-pad minimum
    example = torch.zeros(2, max(module.min_frames, 2) + 3, module.mel_dim)
    shapes = ({0: Dim("batch"), 1: Dim("frames", min=module.min_frames)},)
    return export_onnx(
        module.eval(),
        (example,),
        path,
        input_names=[INPUT],
        output_names=[OUTPUT],
        dynamic_shapes=shapes,
    )


def engine_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """What a runtime needs to make the engine's input from a waveform (``cfg`` is the
    checkpoint's ``speaker_encoder_config``): upstream's mel_spectrogram arguments, the
    embedding size, and the fewest mel frames the engine takes."""
    cfg = {**DEFAULTS, **cfg}
    return {
        "sample_rate": int(cfg["sample_rate"]),
        "n_fft": N_FFT,
        "num_mels": int(cfg["mel_dim"]),
        "hop_size": HOP_SIZE,
        "win_size": WIN_SIZE,
        "fmin": FMIN,
        "fmax": FMAX,
        "embedding_size": int(cfg["enc_dim"]),
        "min_frames": min_frames(cfg),
    }
