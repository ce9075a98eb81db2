"""The Qwen3 families' AuT audio encoder at run time: log-mel [128, n] -> audio tokens
[count, output_dim].

Everything data-dependent is computed here in numpy and handed to the engine as index arrays
(the engine I/O is in export/media/audio_encoder.py):

- the mel is cut into chunks of ``2 * n_window`` frames (100) and every chunk is zero-padded to
  the LONGEST chunk of the call, as Qwen3-Omni's transformers code does: padded frames change the
  last valid tokens of a short chunk (conv bias + GELU), so padding a 60-frame clip to 100 would
  not match. Qwen3-ASR's feature extractor pads the mel to whole chunks instead, so its
  encoder's config says ``chunk_padding: "full"`` and every chunk is padded to 100 frames;
- chunk c's valid tokens are ``c * T_P + t`` for t below the chunk's conv output length, T_P
  being the conv output length of the longest chunk;
- those tokens, in order, are cut into attention windows of ``T_P * chunks_per_window`` tokens
  (HF's n_window_infer; 104 tokens = 8 s) and laid out as rows of a [W, S] batch.

Windows never share tokens, so a long clip is encoded in calls of at most ``chunks_per_call``
chunks (whole windows, all padded to the clip's longest chunk): the result equals one call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime.artifacts import Artifact, check_folder
from edgeomni.runtime.engine import Engine, EngineError, open_engine

INPUTS = ("padded_feature", "window_index", "window_lens", "output_index")
OUTPUT = "last_hidden_state"


def conv_tokens(frames: np.ndarray | int) -> np.ndarray:
    """Tokens the three stride-2 convs (kernel 3, padding 1) make of a chunk of ``frames``."""
    t = np.asarray(frames, dtype=np.int64)
    for _ in range(3):
        t = (t + 1) // 2
    return t


def window_layout(
    chunk_lens: np.ndarray, longest: int, chunks_per_window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(window_index [W, S] int64, window_lens [W] int32, output_index [N] int64) for chunks of
    ``chunk_lens`` frames, each padded to ``longest`` frames: HF's valid_indices and cu_seqlens
    for one audio, as rows of a batch."""
    per_chunk = int(conv_tokens(longest))
    tokens = conv_tokens(chunk_lens)
    valid = np.flatnonzero(np.arange(per_chunk)[None, :] < tokens[:, None])  # c * T_P + t
    n = valid.size
    window = per_chunk * chunks_per_window
    rows, width = -(-n // window), min(n, window)
    j = np.arange(n)
    slot = (j // window) * width + j % window
    window_index = np.zeros(rows * width, np.int64)  # padding slots read token 0: finite, unused
    window_index[slot] = valid
    window_lens = np.bincount(j // window, minlength=rows).astype(np.int32)
    return window_index.reshape(rows, width), window_lens, slot.astype(np.int64)


ARTIFACT = Artifact(
    keys=("num_mel_bins", "chunk_frames", "chunks_per_window", "output_dim", "chunks_per_call")
)


class AudioEncoder:
    """Encode one audio's log-mel features through the audio encoder engine of ``folder``."""

    def __init__(
        self, folder: Path, *, threads: int | None = None, chunks_per_call: int | None = None
    ) -> None:
        folder = Path(folder)
        self.config = cfg = check_folder(folder, ARTIFACT).config
        self.engine: Engine = open_engine(folder, cfg, threads=threads)
        missing = [n for n in INPUTS if n not in self.engine.input_names]
        missing += [n for n in (OUTPUT,) if n not in self.engine.output_names]
        if missing:
            raise EngineError(f"{folder}: the audio encoder engine lacks {', '.join(missing)}")
        self.num_mel_bins = int(cfg["num_mel_bins"])
        self.chunk_frames = int(cfg["chunk_frames"])
        self.chunks_per_window = int(cfg["chunks_per_window"])
        self.output_dim = int(cfg["output_dim"])
        # "longest" (Qwen3-Omni) or "full" (Qwen3-ASR): what each chunk is zero-padded to
        self.chunk_padding = str(cfg.get("chunk_padding") or "longest")
        if self.chunk_padding not in ("longest", "full"):
            raise EngineError(f"{folder}: chunk_padding must be longest or full, "
                              f"got {self.chunk_padding!r}")  # fmt: skip
        # 16 kHz samples a shorter clip is zero-padded to before its log-mel (audio_input.py)
        self.min_samples = int(cfg.get("min_samples") or 0)
        per_call = int(chunks_per_call or cfg["chunks_per_call"])
        # whole windows per call, at least one: a window split across calls would change it
        self.chunks_per_call = max(1, per_call // self.chunks_per_window) * self.chunks_per_window

    def token_count(self, n_frames: int) -> int:
        """Tokens ``encode`` returns for ``n_frames`` mel frames (the prompt's audio pads)."""
        full, rest = divmod(int(n_frames), self.chunk_frames)
        return int(full * conv_tokens(self.chunk_frames) + (conv_tokens(rest) if rest else 0))

    def encode(self, features: np.ndarray) -> np.ndarray:
        """features [num_mel_bins, n_frames] -> float32 [token_count(n_frames), output_dim]."""
        padded, chunk_lens, longest = self._chunks(features)
        out = np.empty((int(conv_tokens(chunk_lens).sum()), self.output_dim), np.float32)
        done = 0
        for start in range(0, chunk_lens.size, self.chunks_per_call):
            part = slice(start, start + self.chunks_per_call)
            count = int(conv_tokens(chunk_lens[part]).sum())
            self._run(padded[part], chunk_lens[part], longest, out[done : done + count])
            done += count
        return out

    def encode_many(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """``encode`` for several clips (of several requests) in as few calls as they fit:
        clips whose chunks are padded to the same length share calls of at most
        ``chunks_per_call`` chunks, each clip's windows rows of its own, so every clip comes
        out as ``encode`` gives it alone (a clip longer than a call goes alone)."""
        chunked = [self._chunks(x) for x in clips]
        out: list[Any] = [None] * len(clips)
        groups: dict[int, list[list[int]]] = {}
        for i, (_, lens, longest) in enumerate(chunked):
            if lens.size > self.chunks_per_call:
                out[i] = self.encode(clips[i])
                continue
            calls = groups.setdefault(longest, [[]])
            if sum(chunked[j][1].size for j in calls[-1]) + lens.size > self.chunks_per_call:
                calls.append([])
            calls[-1].append(i)
        for longest, calls in groups.items():
            for call in calls:
                counts = [int(conv_tokens(chunked[i][1]).sum()) for i in call]
                rows = np.empty((sum(counts), self.output_dim), np.float32)
                layouts = [window_layout(chunked[i][1], longest, self.chunks_per_window)
                           for i in call]  # fmt: skip
                padded = np.concatenate([chunked[i][0] for i in call])
                self._call(padded, _stacked(layouts, [chunked[i][1].size for i in call],
                                            int(conv_tokens(longest))), rows)  # fmt: skip
                bounds = np.cumsum([0, *counts])
                for i, a, b in zip(call, bounds[:-1], bounds[1:], strict=True):
                    out[i] = rows[a:b]
        return out

    def _chunks(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """A clip's mel as padded chunks [C, mels, longest], each chunk's frames, and the
        length every chunk is padded to."""
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[0] != self.num_mel_bins:
            raise ValueError(
                f"expected features [{self.num_mel_bins}, n_frames], got shape {x.shape}"
            )
        n = x.shape[1]
        if n < 1:
            raise ValueError("audio features hold no frames")
        size = self.chunk_frames
        full, rest = divmod(n, size)
        chunk_lens = np.full(full + (rest > 0), size, np.int64)
        if rest:
            chunk_lens[-1] = rest
        # HF pads every chunk to the longest one of the call (Qwen3-ASR's to a whole chunk)
        longest = size if self.chunk_padding == "full" else int(chunk_lens.max())
        padded = np.zeros((chunk_lens.size, self.num_mel_bins, longest), np.float32)
        if full:
            whole = x[:, : full * size].reshape(self.num_mel_bins, full, size)
            padded[:full] = whole.transpose(1, 0, 2)
        if rest:
            padded[full, :, :rest] = x[:, full * size :]
        return padded, chunk_lens, longest

    def _run(self, padded: np.ndarray, lens: np.ndarray, longest: int, out: np.ndarray) -> None:
        """One engine call for whole windows; writes straight into ``out`` (contiguous rows)."""
        self._call(padded, window_layout(lens, longest, self.chunks_per_window), out)

    def _call(self, padded: np.ndarray, layout: tuple[np.ndarray, ...], out: np.ndarray) -> None:
        binding = self.engine.binding()
        binding.bind_output(OUTPUT, out)
        binding.run(dict(zip(INPUTS, (padded, *layout), strict=True)))


def _stacked(
    layouts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], chunks: list[int], per_chunk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The window layouts of clips laid one after the other in one call: each clip's token
    indices moved past the chunks before it, its windows rows after the rows before it, all
    rows padded to the widest (padding slots read token 0, their output unused)."""
    width = max(index.shape[1] for index, _, _ in layouts)
    indices, lens, slots = [], [], []
    chunk0 = row0 = 0
    for (index, window_lens, slot), n_chunks in zip(layouts, chunks, strict=True):
        rows, w = index.shape
        wide = np.zeros((rows, width), np.int64)
        wide[:, :w] = index + chunk0 * per_chunk
        wide[:, w:] = 0
        indices.append(wide)
        lens.append(window_lens)
        slots.append((slot // w + row0) * width + slot % w)
        chunk0 += n_chunks
        row0 += rows
    return np.concatenate(indices), np.concatenate(lens), np.concatenate(slots).astype(np.int64)
