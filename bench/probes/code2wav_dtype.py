"""Probe: Qwen3-TTS's code2wav engine on a GPU in float32 as the runtime opens it (what
edge-build makes) against a variant (float16, or other CUDA provider options), both timed
through the runtime's own runner (fixed-length windows, replayed CUDA graphs) at the window
shapes the pipeline runs, and compared sample by sample (docs/history/benchmarks-2026-12-01.md, session 14).

    python3 bench/probes/code2wav_dtype.py --ckpt CKPT --out OUT_DIR [--dtype float16|float32]
        [--conv-search DEFAULT|HEURISTIC|EXHAUSTIVE] [--nhwc]

CKPT: a Qwen3-TTS checkpoint (export/tiny_tts.py). Both engines are exported here from its
speech_tokenizer/ weights and lowered as edge-build lowers a cuda component; the float16 one is
the module in float16, its output cast to float32. Prints a JSON line per shape; writes
OUT_DIR/result.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgeomni.builder.onnxruntime import build_engine
from edgeomni.export.families.qwen3_tts import code2wav as c2w
from edgeomni.export.family import BuildArgs
from edgeomni.graph_schema import Emit, Input, Stage
from edgeomni.runtime.speech.code2wav import Code2Wav


class HalfGraph(c2w.Code2WavGraph):
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return super().forward(codes).float()


def engine(ckpt: Path, work: Path, dtype: str) -> Path:
    """The code2wav engine folder in ``dtype``, made as edge-build makes a cuda component."""
    folder = work / f"code2wav-{dtype}"
    if (folder / "config.json").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    decoder = c2w.load_decoder(ckpt / "speech_tokenizer")
    raw = work / f"raw-{dtype}" / "model.onnx"
    raw.parent.mkdir(parents=True, exist_ok=True)
    if dtype == "float16":
        decoder = decoder.half()
        cfg = decoder.pre_transformer.config
        c2w.omni.export_graph(HalfGraph(decoder.eval()), cfg.codebook_size,
                              decoder.num_quantizers, raw)  # fmt: skip
    else:
        c2w.export_code2wav(decoder, raw)
    args = BuildArgs(max_batch_size=32, max_input_len=192, max_kv_cache_capacity=320,
                     device="cuda", dtype=dtype)  # fmt: skip
    tokenizer = json.loads((ckpt / "speech_tokenizer" / "config.json").read_text())
    config = {**c2w.code2wav_engine_config(tokenizer), "backend": "onnxruntime",
              "device": "cuda"}  # fmt: skip
    config["lowering"] = build_engine(raw, folder / config["engine"], args)
    config["dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@contextlib.contextmanager
def provider_options(search: str | None, nhwc: bool) -> Iterator[None]:
    """Sessions made inside take these CUDA provider options over the runtime's."""
    import onnxruntime as ort

    real = ort.InferenceSession

    def session(path: str, so: Any, providers: list[Any]) -> Any:
        out = []
        for provider in providers:
            if isinstance(provider, tuple) and provider[0] == "CUDAExecutionProvider":
                opts = dict(provider[1])
                if search:
                    opts["cudnn_conv_algo_search"] = search
                if nhwc:
                    opts["prefer_nhwc"] = "1"
                provider = (provider[0], opts)
            out.append(provider)
        return real(path, so, providers=out)

    ort.InferenceSession = session
    try:
        yield
    finally:
        ort.InferenceSession = real


def stage() -> Stage:
    return Stage(id="code2wav", runner="qwen3_tts.code2wav", artifact="code2wav",
                 kind="iterative", inputs=(Input("codes", "talker:codes"),),
                 emits=(Emit("audio", "audio", terminal=True),),
                 config={"window_frames": 25, "first_window_frames": 5})  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/code2wav-dtype"))
    p.add_argument("--calls", type=int, default=20)
    p.add_argument(
        "--dtype",
        choices=("float16", "float32"),
        default="float16",
        help="the variant's engine (the baseline: float32 as the runtime opens it)",
    )
    p.add_argument(
        "--conv-search",
        help="the variant's cudnn_conv_algo_search (default: the runtime's, HEURISTIC)",
    )
    p.add_argument("--nhwc", action="store_true", help="the variant with prefer_nhwc")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    runners = {}
    for name, dtype in (("base", "float32"), ("variant", a.dtype)):
        t = time.perf_counter()
        folder = engine(a.ckpt, a.work, dtype)
        print(f"{dtype} engine made in {time.perf_counter() - t:.1f} s", flush=True)
        if name == "variant" and (a.conv_search or a.nhwc):
            with provider_options(a.conv_search, a.nhwc):
                runners[name] = Code2Wav(stage(), folder)
        else:
            runners[name] = Code2Wav(stage(), folder)
    rng = np.random.default_rng(0)
    results = []
    # the pipeline's window lengths (5, 15, 35, 50 frames with their context) at 1, 16, 32 rows
    for rows in (1, 16, 32):
        for frames in (5, 15, 35, 50):
            codes = rng.integers(0, 2048, (rows, 16, frames))
            row = {"rows": rows, "frames": frames}
            audio = {}
            for name, runner in runners.items():
                runner.decode_batch(codes)  # capture
                times = []
                for _ in range(a.calls):
                    start = time.perf_counter()
                    audio[name] = runner.decode_batch(codes)
                    times.append((time.perf_counter() - start) * 1e3)
                row[f"{name}_ms"] = round(statistics.median(times), 3)
            ref, got = audio["base"], audio["variant"]
            err = got - ref
            row["max_abs_diff"] = float(np.abs(err).max())
            row["peak"] = float(np.abs(ref).max())
            snr = 10 * np.log10((ref**2).sum() / max((err**2).sum(), 1e-30))
            row["snr_db"] = round(float(snr), 2)
            row["speedup"] = round(row["base_ms"] / row["variant_ms"], 2)
            print(json.dumps(row), flush=True)
            results.append(row)
    (a.out / "result.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
