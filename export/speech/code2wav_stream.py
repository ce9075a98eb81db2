"""code2wav as a stateful step: a chunk of new codes and each request's state in, the chunk's
samples and the new state out, so every frame is decoded once (Qwen3-Omni's and, through
``StreamGraph``'s hooks, Qwen3-TTS's).

A call takes ``codes`` [B, Q, n], ``chunk_lens`` [B] (the valid frames of each row, at most n;
rows are right-padded, 0 sits a row out) and one ``state_<name>`` per state tensor; it returns
``waveform`` [B, 1, n*S] (row b's first ``chunk_lens[b]*S`` samples are its audio) and one
``next_state_<name>`` per state tensor, the state after the row's valid frames. The state of a
request, per row (``StreamGraph.layout``; config.json declares it, the runtime allocates it zeroed):

- ``frames``: frames decoded so far: rotary positions, how much of the attention state is
  valid, where a stream's first samples are;
- ``key_<i>``/``value_<i>`` per transformer layer: the keys (rotary applied) and values of the
  last ``sliding_window - 1`` frames, left-aligned (slot j holds frame
  ``frames - min(frames, window-1) + j``): all a sliding-window query reaches back to;
- ``conv_<i>``: each causal convolution of kernel span K > 1 keeps its last K - 1 inputs (zeros
  at first: the whole decode's left padding);
- ``trans_<i>``: each transposed convolution of kernel a*stride keeps its last a - 1 inputs
  (output block m needs inputs m-a+1..m). ConvNeXt's upsamplers (kernel = stride) keep none.

Everything else (embeddings, norms, MLPs, SnakeBeta, 1x1 convs) is per time step.

Exactness against the whole-utterance decode: a transposed conv trimming ``left_pad`` samples
on the left (Qwen3-Omni's decoder blocks: stride r, kernel 2r, ``left_pad`` r) would have the
stream's first block be samples the whole decode cuts off. The stream keeps them and counts them
instead: after a transposed conv, the first ``delay`` samples of each stream (``delay =
delay_in*stride + left_pad``) are not audio, and every time-mixing op after it reads them as
zeros (``_Call.masked``), which is what the whole decode's zero padding is; the whole decode's right
trim (``kernel - stride``) is exactly the block the stream never makes. A stream thus starts
with ``delay_samples`` samples that are not audio (Qwen3-Omni: 480 + 60 + 12 + 3 = 555, the
whole decode's ``trim``; Qwen3-TTS, whose transposed convs trim on the right only: 0), which the
runtime drops; after them it is the whole decode, sample for sample.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgeomni.export.common.onnx_export import export_onnx
from edgeomni.export.speech import code2wav as omni
from edgeomni.export.speech.code2wav import hf
from edgeomni.graph_schema import state as schema
from edgeomni.plugins import attention as attention_plugin

ENGINE = "code2wav_stream.onnx"
COMPONENT = "code2wav_stream"
CODES, LENS, OUTPUT = "codes", "chunk_lens", "waveform"
PAST, PRESENT = "state_", "next_state_"
# the longest chunk one call takes (a build limit: TensorRT profiles, the runtime's check);
# as HF generate()'s window, so a whole utterance up to it can be one chunk
MAX_CHUNK_FRAMES = omni.WINDOW_FRAMES
# the runtime's defaults (the stage config overrides them): a first chunk of 2 frames (160 ms
# at 12.5 frames a second) for early audio, then chunks doubling up to 25 frames (2 s)
FIRST_CHUNK_FRAMES, CHUNK_FRAMES = 2, 25


@dataclass(frozen=True)
class StateTensor:
    """One state tensor of a request: its name and its shape and dtype per row."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def declared(self) -> schema.StateTensor:
        """Its declaration (graph_schema.state): opaque, a row's whole tensor carried from one
        call to the next, bound as PAST + name and returned as PRESENT + name."""
        return schema.StateTensor(self.name, "opaque", PAST + self.name, PRESENT + self.name,
                                  self.shape, str(self.dtype)[6:], (LENS,))  # fmt: skip


class _Call:
    """One forward's state tensors, read and written in order, and where the stream stands in
    it. Without ``past`` (a dry run) each state read is zeros and recorded in ``layout``, which
    is how ``StreamGraph.layout`` is found."""

    def __init__(self, past: Sequence[torch.Tensor] | None, lens: torch.Tensor) -> None:
        self.past = past
        self.lens = lens  # valid frames per row
        self.layout: list[StateTensor] = []
        self.present: list[torch.Tensor] = []
        self.frames = self.read("frames", (), torch.int64)
        self.write(self.frames + lens)
        self.delay = 0  # samples at the current rate each stream starts with that are not audio
        self.rate = 1  # samples per frame at the current point
        self.counts: dict[str, int] = {}
        self.made: dict[tuple[Any, ...], torch.Tensor] = {}  # masks and indices, once per rate

    def read(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> Any:
        index = len(self.layout)
        self.layout.append(StateTensor(name, tuple(int(s) for s in shape), dtype))
        if self.past is None:
            return torch.zeros((self.lens.shape[0], *shape), dtype=dtype)
        return self.past[index]

    def write(self, tensor: torch.Tensor) -> None:
        self.present.append(tensor)

    def masked(self, x: torch.Tensor) -> torch.Tensor:
        """x with the stream's first ``delay`` samples (not audio yet) read as zeros."""
        if not self.delay:
            return x
        key = ("mask", self.rate)
        if key not in self.made:
            at = (self.frames * self.rate)[:, None, None] + torch.arange(x.shape[-1])[None, None]
            self.made[key] = (at >= self.delay).to(x.dtype)
        return x * self.made[key]

    def history(self, x: torch.Tensor, count: int, kind: str) -> torch.Tensor:
        """x [B, C, n*rate] after the last ``count`` inputs before it (a state tensor), and the
        state written back: the last ``count`` of each row's valid inputs."""
        number = self.counts[kind] = self.counts.get(kind, -1) + 1
        both = torch.cat([self.read(f"{kind}_{number}", (x.shape[1], count)), x], 2)
        key = ("index", self.rate, count)
        if key not in self.made:
            start = (self.lens * self.rate)[:, None, None]
            self.made[key] = start + torch.arange(count)[None, None, :]  # [B, 1, count]
        self.write(torch.gather(both, 2, self.made[key].expand(-1, x.shape[1], -1)))
        return both


def _rows_from(x: torch.Tensor, start: torch.Tensor, count: int) -> torch.Tensor:
    """x[b, :, start[b] : start[b] + count] of a [B, H, S, D] cache, for every row b."""
    index = start[:, None, None, None] + torch.arange(count)[None, None, :, None]
    return torch.gather(x, 2, index.expand(-1, x.shape[1], -1, x.shape[3]))


class StreamGraph(omni.Code2WavGraph):
    """The exported step: HF's code2wav (``model``) run on a chunk with state (the window
    graph's dimensions and rotary; its own forward). A family's subclass gives its input stage
    (``_hidden``) and the transformer's output (``_latent``)."""

    def __init__(self, model: nn.Module, cfg: Any = None) -> None:
        super().__init__(model, cfg)
        if self.window < 1:
            raise ValueError(
                "code2wav without a sliding window attends to every frame before: its state "
                "would grow without bound (no stateful step)"
            )
        self._dry: _Call | None = None

    # -- per family ----------------------------------------------------------------------
    def _hidden(self, c: _Call, codes: torch.Tensor) -> torch.Tensor:
        """Codes [B, Q, n] -> the transformer's input [B, n, H]."""
        m = self.model
        return m.code_embedding(codes + m.code_offset).mean(1)

    def _latent(self, h: torch.Tensor) -> torch.Tensor:
        """The transformer's output [B, n, H] -> the upsampler's input [B, C, n]."""
        return h.permute(0, 2, 1)

    @property
    def num_quantizers(self) -> int:
        m = self.model
        return int(getattr(m, "num_quantizers", None) or m.config.num_quantizers)

    # -- the step --------------------------------------------------------------------------
    def dry_run(self) -> _Call:
        """One frame at batch 1 from a zero state: what the state is (``layout``) and how many
        samples a stream starts with that are not audio (``delay``). On the model's device: a
        model on the meta device (no weights) gives them as well."""
        if self._dry is None:
            device = next(self.model.parameters()).device
            with torch.no_grad(), torch.device(device):
                c = _Call(None, torch.ones(1, dtype=torch.int64))
                self._step(c, torch.zeros(1, self.num_quantizers, 1, dtype=torch.int64))
            self._dry = c
        return self._dry

    @property
    def layout(self) -> list[StateTensor]:
        """The state tensors, in input order."""
        return self.dry_run().layout

    def delay_samples(self) -> int:
        """Samples each stream starts with that are not audio."""
        return int(self.dry_run().delay)

    def forward(
        self, codes: torch.Tensor, chunk_lens: torch.Tensor, past: list[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        c = _Call(past, chunk_lens)
        wav = self._step(c, codes)
        return (wav, *c.present)

    def _step(self, c: _Call, codes: torch.Tensor) -> torch.Tensor:
        x = self._latent(self._transformer(c, self._hidden(c, codes)))
        for blocks in self.model.upsample:
            for block in blocks:
                x = self._apply(c, block, x)
        for block in self.model.decoder:
            x = self._apply(c, block, x)
        return x.clamp(min=-1, max=1)

    # -- the transformer: sliding-window attention over the state's keys and the chunk's ----
    def _transformer(self, c: _Call, h: torch.Tensor) -> torch.Tensor:
        pre = self.model.pre_transformer
        b, n, _ = h.shape
        positions = c.frames[:, None] + torch.arange(n)[None, :]  # [B, n]
        cos, sin = pre.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        hist = self.window - 1
        past_lens = c.frames.clamp(max=hist).to(torch.int32)  # valid slots of the key state
        # n per row, counted on the device (as the window graph does)
        query_lens = torch.ones_like(h[:, :, 0], dtype=torch.int64).sum(-1).to(torch.int32)
        # the slots the next state keeps: each row's last ``hist`` valid ones
        start = (past_lens.to(torch.int64) + c.lens - hist).clamp(min=0)
        for i, layer in enumerate(pre.layers):
            x = layer.input_layernorm(h)
            attn = layer.self_attn
            q, k = self._rotated(attn, x, cos, sin)
            caches = []
            for kind in ("key", "value"):
                fresh = x.new_zeros(b, self.num_kv_heads, n, self.head_dim)
                if hist:
                    past = c.read(f"{kind}_{i}", (self.num_kv_heads, hist, self.head_dim))
                    fresh = torch.cat([past, fresh], 2)
                caches.append(fresh)
            out, key, value = attention_plugin.torch_op()(
                q.reshape(b, n, -1), k.reshape(b, n, -1), attn.v_proj(x), caches[0], caches[1],
                past_lens, query_lens, self.num_heads, self.num_kv_heads, float(attn.scaling),
                self.window,
            )  # fmt: skip
            if hist:
                c.write(_rows_from(key, start, hist))
                c.write(_rows_from(value, start, hist))
            h = h + layer.self_attn_layer_scale(attn.o_proj(out))
            h = h + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(h)))
        return pre.norm(h)

    # -- convolutions with state -------------------------------------------------------------
    def _conv(self, c: _Call, m: hf.Qwen3OmniMoeCausalConvNet, x: torch.Tensor) -> torch.Tensor:
        if m.stride != 1:
            raise ValueError("only stride-1 causal convs are exported (code2wav has no other)")
        if m.padding == 0:  # kernel 1: per time step
            return m.conv(x)
        return m.conv(c.history(c.masked(x), m.padding, "conv"))

    def _trans_conv(
        self, c: _Call, m: hf.Qwen3OmniMoeCausalTransConvNet, x: torch.Tensor
    ) -> torch.Tensor:
        conv = m.conv
        kernel, stride = int(conv.kernel_size[0]), int(conv.stride[0])
        if kernel % stride or m.right_pad != kernel - stride:
            raise ValueError(
                f"a transposed conv of kernel {kernel}, stride {stride} trims {m.left_pad} + "
                f"{m.right_pad}: streamed are kernel = a * stride, trimming kernel - stride "
                "on the right"
            )
        hist, n = kernel // stride - 1, x.shape[-1]
        if hist:  # output block j needs inputs j - hist .. j
            y = conv(c.history(c.masked(x), hist, "trans"))[
                ..., hist * stride : (hist + n) * stride
            ]
        else:  # each input's own block: nothing carried
            y = conv(x)
        c.delay = c.delay * stride + m.left_pad
        c.rate *= stride
        return y

    def _apply(self, c: _Call, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """HF's forward of one vocoder module, streamed."""
        if isinstance(m, hf.Qwen3OmniMoeCausalConvNet):
            return self._conv(c, m, x)
        if isinstance(m, hf.Qwen3OmniMoeCausalTransConvNet):
            return self._trans_conv(c, m, x)
        if isinstance(m, hf.Qwen3OmniMoeConvNeXtBlock):
            y = self._conv(c, m.dwconv, x).permute(0, 2, 1)
            y = m.pwconv2(m.act(m.pwconv1(m.norm(y))))
            return x + (m.gamma * y).permute(0, 2, 1)
        if isinstance(m, hf.Qwen3OmniMoeCode2WavDecoderResidualUnit):
            y = self._conv(c, m.conv1, m.act1(x))
            return x + self._conv(c, m.conv2, m.act2(y))
        if isinstance(m, hf.Qwen3OmniMoeCode2WavDecoderBlock):
            for sub in m.block:
                x = self._apply(c, sub, x)
            return x
        if isinstance(m, hf.Qwen3OmniMoeSnakeBeta):
            return m(x)
        raise TypeError(f"no streamed form of {type(m).__name__}")


def export_stream(graph: StreamGraph, codebook_size: int, path: Path) -> Path:
    """The step graph to ONNX: batch and chunk frames dynamic (example 2 x 5), the state
    tensors' per-row shapes fixed."""
    from torch.export import Dim

    layout = graph.layout
    batch, frames = Dim("batch"), Dim("frames")
    codes = torch.randint(0, codebook_size, (2, graph.num_quantizers, 5))
    lens = torch.tensor([5, 3], dtype=torch.int64)
    past = [torch.zeros((2, *t.shape), dtype=t.dtype) for t in layout]
    past[0] = torch.tensor([0, 7], dtype=torch.int64)  # frames: one fresh row, one going on
    shapes = ({0: batch, 2: frames}, {0: batch}, [{0: batch} for _ in layout])
    return export_onnx(
        graph,
        (codes, lens, past),
        Path(path),
        input_names=[CODES, LENS, *(PAST + t.name for t in layout)],
        output_names=[OUTPUT, *(PRESENT + t.name for t in layout)],
        dynamic_shapes=shapes,
    )


def stream_engine_config(
    graph: StreamGraph, base: dict[str, Any], *, max_chunk_frames: int = MAX_CHUNK_FRAMES
) -> dict[str, Any]:
    """config.json of the step engine: ``base`` (the code2wav engine's fields: component,
    model type, codebook, rates) with the step's inputs, outputs and state layout."""
    layout = graph.layout
    out = {key: base[key] for key in ("model_type", "num_quantizers", "codebook_size",
                                      "samples_per_frame", "sample_rate", "backend", "device",
                                      "tf32")
           if key in base}  # fmt: skip
    return {
        **out,
        "component": COMPONENT,
        "engine": ENGINE,
        "dtype": "float32",
        "inputs": {
            CODES: "int64 [batch, num_quantizers, frames]",
            LENS: "int64 [batch]: valid frames per row (at most frames; 0 sits the row out)",
        },
        "outputs": {OUTPUT: "float32 [batch, 1, frames*samples_per_frame]"},
        # per row: graph inputs PAST + name, outputs PRESENT + name, [batch, *shape]
        "state": [t.declared().describe() for t in layout],
        "delay_samples": graph.delay_samples(),
        "max_chunk_frames": max_chunk_frames,
        "first_chunk_frames": FIRST_CHUNK_FRAMES,
        "chunk_frames": CHUNK_FRAMES,
        "sliding_window": graph.window,
    }


def stage_config(components: Mapping[str, str]) -> dict[str, Any]:
    """The code2wav stage's config in a graph of these built components (name -> folder): it
    streams with the step engine when that was built (``streaming``: the runtime's default
    mode, ``stream``: its folder, relative to code2wav's), else in windows (no keys)."""
    if COMPONENT not in components or "code2wav" not in components:
        return {}
    where = posixpath.relpath(components[COMPONENT], components["code2wav"])
    return {"streaming": "stateful", "stream": where}


def dim_ranges(batch: int) -> dict[str, dict[str, Any]]:
    """The sizes the runtime calls the step engine with: up to ``batch`` rows of chunks of up
    to MAX_CHUNK_FRAMES frames, tuned for the default chunk (export/common/shapes.py)."""
    from edgeomni.export.common.shapes import upto

    return {"chunk": {"batch": upto(batch), "frames": upto(MAX_CHUNK_FRAMES, opt=CHUNK_FRAMES)}}
