"""Stateful streaming code2wav against the windows, on this CPU (ONNX Runtime, CPU provider).

For each vocoder (random weights; the tiny test sizes and the real Qwen3-Omni and Qwen3-TTS
dimensions), both engines are exported and built as edge-build builds them, then the same
random utterance is vocoded by the code2wav runner three ways:

- ``windows``: today's streamed windows (``--window`` new frames decoded with ``--context``
  frames of left context, the issue's 25 + 25), each window again with its context;
- ``stateful``: chunks of ``--first`` frames, then doubling to ``--chunk``, each frame once,
  with the state carried from call to call;
- ``whole``: the utterance in one call (the reference both must equal).

Printed per vocoder and batch: frames vocoded per emitted frame, engine calls, wall time per
second of audio emitted (seconds of CPU wall time per audio second; the median of
``--repeats`` runs, with the spread), the frames the first audio waits for and its call's time
(at B=1), and the largest difference from the whole decode (the windows' 25 frames of context
are exact only for vocoders whose receptive field they cover: the tiny ones, not the real). ``--batch N`` runs N requests stepping together (their chunks and windows batched).

    python bench/stateful_code2wav_cpu.py [--models tiny,omni,tts] [--frames 75] [--batch 1,4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np


def _reinit(model: Any, out_conv: Any) -> Any:
    """Random weights that give audio inside the clamp and no denormals: matrices at std
    1/sqrt(fan_in), SnakeBeta log-alpha/beta near 0, layer scales about 0.1 (tests'
    tiny_model does the same)."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1 / math.sqrt(1 if "embedding" in name else p[0].numel()))
            elif name.endswith(("alpha", "beta")):
                p.normal_(0, 0.1)
            elif name.endswith(("scale", "gamma")):
                p.uniform_(0.05, 0.15)
            elif name.endswith("weight"):
                p.normal_(1, 0.1)
            elif name.endswith("cluster_usage"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.1)
        out_conv.weight.mul_(0.005)
    return model.eval()


def omni_model(size: str) -> Any:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    if size == "tiny":  # tests/test_code2wav.py's and export/tiny_omni.py's proportions
        cfg = Qwen3OmniMoeCode2WavConfig(hidden_size=32, num_attention_heads=2,
                                         num_key_value_heads=2, num_hidden_layers=2,
                                         intermediate_size=64, sliding_window=8, decoder_dim=64,
                                         codebook_size=64, num_quantizers=16)  # fmt: skip
    else:  # the class defaults are Qwen3-Omni-30B-A3B's code2wav
        cfg = Qwen3OmniMoeCode2WavConfig()
    model = Qwen3OmniMoeCode2Wav(cfg)
    return _reinit(model, model.decoder[-1].conv)


def tts_model() -> Any:
    """Qwen3-TTS 0.6B's codec decoder dimensions (export/tiny_tts.py's ``0.6b``)."""
    from edgeomni.export.families.qwen3_tts import code2wav as t2w
    from edgeomni.export.tiny_tts import codec_config

    model = t2w.Qwen3TTSCode2Wav(codec_config("0.6b")["decoder_config"])
    return _reinit(model, model.decoder[-1].conv), codec_config("0.6b")


def build(name: str, root: Path) -> Path:
    """Both engines and their config.json, as edge-build writes them; returns the code2wav
    folder (the step engine's is ../code2wav_stream)."""
    from edgeomni.builder.onnxruntime import build_engine
    from edgeomni.export.common.artifacts import write_engine_config
    from edgeomni.export.families.qwen3_omni import code2wav as c2w
    from edgeomni.export.families.qwen3_tts import code2wav as t2w
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.speech import code2wav_stream as stream

    args = BuildArgs(1, 1, 1)
    folders = {"code2wav": root / "code2wav", "stream": root / "code2wav_stream"}
    for folder in folders.values():
        folder.mkdir(parents=True)
    start = time.perf_counter()
    if name == "tts":
        model, codec = tts_model()
        raw = t2w.export_code2wav(model, root / "raw" / c2w.ENGINE)
        raw_stream = t2w.export_stream(model, root / "raw" / stream.ENGINE)
        configs = (t2w.code2wav_engine_config(codec), t2w.stream_engine_config(codec))
        configs = tuple({**c, "backend": "onnxruntime", "device": "cpu"} for c in configs)
    else:
        model = omni_model(name)
        raw = c2w.export_code2wav(model, root / "raw" / c2w.ENGINE)
        raw_stream = c2w.export_omni(model, root / "raw" / stream.ENGINE)
        configs = (c2w.code2wav_engine_config(model.config),
                   c2w.omni_engine_config(model.config))  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    build_engine(raw, folders["code2wav"] / c2w.ENGINE, args)
    build_engine(raw_stream, folders["stream"] / stream.ENGINE, args)
    write_engine_config(folders["code2wav"], configs[0])
    write_engine_config(folders["stream"], configs[1])
    print(f"{name}: {params / 1e6:.1f}M parameters, exported and built in "
          f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    return folders["code2wav"]


def runner(folder: Path, threads: int, **config: Any) -> Any:
    from edgeomni.graph_schema import Emit, Input, Stage
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.speech.code2wav import Code2Wav

    stage = Stage(id="code2wav", runner="qwen3_omni.code2wav", artifact="code2wav",
                  kind="iterative", inputs=(Input("codes", "talker:codes"),),
                  emits=(Emit("audio", "audio", terminal=True),), config=config)  # fmt: skip
    return Code2Wav(stage, folder, engines=Engines(threads=threads))


def vocode(r: Any, utterances: list[np.ndarray]) -> tuple[list[np.ndarray], float, float, int]:
    """The utterances as requests stepping together: every frame in, ready chunks or windows
    vocoded, batched across requests (as the stage does once the talker has made them); returns
    (audio per request, wall seconds, first piece's seconds at B=1, engine calls)."""
    from edgeomni.runtime.stage import RequestState

    batch = r.stream_batch()
    streams = [r.stream_for(RequestState(i, None, None), batch) for i in range(len(utterances))]
    calls = [0]
    if r.step is None:  # count the windows engine's calls
        decode = r.decode_batch

        def counted(codes: np.ndarray) -> np.ndarray:
            calls[0] += 1
            return decode(codes)

        r.decode_batch = counted
    else:
        r.step.calls = 0
    start = time.perf_counter()
    first = None
    for stream, codes in zip(streams, utterances, strict=True):
        stream(codes[: r.chunks.first if r.chunks else r.windows.first_window])
    batch.decode_ready()
    first = time.perf_counter() - start
    for stream, codes in zip(streams, utterances, strict=True):
        stream(codes[r.chunks.first if r.chunks else r.windows.first_window :])
    batch.decode_ready()
    for stream in streams:  # the talker finished them together: their tails share a call
        stream.close()
    audio = [stream.finish() for stream in streams]
    wall = time.perf_counter() - start
    if r.step is None:
        del r.decode_batch
    return audio, wall, first, r.step.calls if r.step is not None else calls[0]


def measure(name: str, folder: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    cfg = json.loads((folder / "config.json").read_text())
    spf, rate, trim = cfg["samples_per_frame"], cfg["sample_rate"], cfg["trim"]
    rng = np.random.default_rng(0)
    whole = runner(folder, args.threads, whole_utterance=True)
    modes = {
        "windows": runner(folder, args.threads, streaming="windows", window_frames=args.window,
                          left_context_frames=args.context),
        "stateful": runner(folder, args.threads, streaming="stateful",
                           stream="../code2wav_stream", first_chunk_frames=args.first,
                           chunk_frames=args.chunk),
    }  # fmt: skip
    rows = []
    for b in args.batch:
        utterances = [rng.integers(0, cfg["codebook_size"], (args.frames, cfg["num_quantizers"]))
                      for _ in range(b)]  # fmt: skip
        refs = [whole.vocode(u)[0] for u in utterances]
        for r in modes.values():  # warm-up: sessions, allocations (a window and a chunk more)
            vocode(r, [utterances[0][: args.window + 1]])
        for mode, r in modes.items():
            runs = [vocode(r, utterances) for _ in range(args.repeats)]
            audio, _, _, calls = runs[0]
            walls = sorted(run[1] for run in runs)
            wall, first = walls[len(walls) // 2], sorted(run[2] for run in runs)[len(runs) // 2]
            diff = max(float(np.abs(a - ref).max()) for a, ref in zip(audio, refs, strict=True))
            seconds = sum(a.size for a in audio) / rate
            if mode == "windows":
                lengths = windows_frames(args.frames, args.window, args.context,
                                         r.windows.first_window)  # fmt: skip
            else:
                lengths = args.frames
            rows.append({
                "vocoder": name, "batch": b, "mode": mode, "frames": args.frames,
                "vocoded_per_emitted": round(lengths / args.frames, 3), "calls": calls,
                "audio_s": round(seconds, 2), "wall_s": round(wall, 3),
                "wall_s_spread": [round(walls[0], 3), round(walls[-1], 3)],
                "wall_per_audio_s": round(wall / seconds, 4),
                # frames the first audio waits for, and the time of its call(s)
                "first_frames": r.chunks.first if r.chunks else r.windows.first_window,
                "first_ms": round(first * 1e3, 1) if b == 1 else None,
                "max_diff_vs_whole": diff,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            assert audio[0].size == args.frames * spf - trim
    return rows


def windows_frames(n: int, window: int, context: int, first: int) -> int:
    """Frames a windowed stream decodes for n frames: each window's new ones and its context."""
    total, start, index = 0, 0, 0
    while start < n:
        size = first if index == 0 else min(window, first << index)
        end = min(n, start + size)
        total += end - start + min(context, start)
        start, index = end, index + 1
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--models", default="tiny,omni,tts", help="tiny, omni (real dimensions), tts")
    p.add_argument("--frames", type=int, default=75, help="frames per utterance (12.5 a second)")
    p.add_argument("--batch", default="1,4", help="requests stepping together, comma-separated")
    p.add_argument("--real-batch", default="1", help="--batch for the real-dimension vocoders")
    p.add_argument("--window", type=int, default=25)
    p.add_argument("--context", type=int, default=25)
    p.add_argument("--first", type=int, default=2)
    p.add_argument("--chunk", type=int, default=25)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=1, help="runs per mode: the median is shown")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args()
    print(f"# {datetime.date.today()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, {args.threads} threads; python {sys.version.split()[0]}",
          flush=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgeomni-stateful-") as tmp:
        for name in args.models.split(","):
            folder = build(name, Path(tmp) / name)
            batch = args.batch if name == "tiny" else args.real_batch
            run = SimpleNamespace(**{**vars(args), "batch": [int(b) for b in batch.split(",")]})
            rows += measure(name, folder, run)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
