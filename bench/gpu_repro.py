"""Are sampled speech runs on the GPU bit-reproducible between pipeline instances?

Builds a tiny random Qwen3-Omni for cuda (float16), then runs the same three sampled requests
(16 codec frames each, a fixed talker seed) through several fresh pipelines, with the code
predictor drawing in its engine and, for comparison, on the host; prints where each run's codes
first differ from the first run's (row, frame, code group). Used to chase the open finding in
docs/history/benchmarks-2026-11-29-b.md (fourth slice).

    python bench/gpu_repro.py [--runs 4] [--work DIR] [--device cpu]

``--device cpu`` runs the same comparison on ONNX Runtime's CPU provider (a float32 build that
draws in its engine), where every run should be identical.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np


def first_differences(codes: list[np.ndarray], base: list[np.ndarray]) -> list[Any]:
    out = []
    for row, (a, b) in enumerate(zip(codes, base, strict=True)):
        bad = np.argwhere(a != b)
        out.append("same" if not len(bad) else (row, *bad[0].tolist()))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4, help="pipelines per way of drawing")
    p.add_argument("--work", type=Path, default=Path("/tmp/edgeomni-gpu-repro"))
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()

    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.tiny_omni import make_qwen3_omni
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file
    from edgeomni.runtime.speech.code_predictor import CodePredictor

    args.work.mkdir(parents=True, exist_ok=True)
    ckpt, engine = args.work / "ckpt", args.work / f"engine-{args.device}"
    if not (ckpt / "config.json").is_file():
        make_qwen3_omni(ckpt)
    if not (engine / "multistage_config.json").is_file():
        dtype = "float16" if args.device == "cuda" else "float32"
        build_args = BuildArgs(3, 128, 256, device=args.device, dtype=dtype, engine_sampling=True)
        build(ckpt, engine, build_args, ["llm", "talker", "code_predictor", "code2wav"])
    prompts = ("Hello there", "Tell me a story", "Why?")
    body = {"max_generate_length": 8, "top_k": 1, "talker_top_k": 10, "talker_seed": 5,
            "talker_max_new_tokens": 17, "talker_min_new_tokens": 17,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": t}]}]}
                         for t in prompts]}  # fmt: skip
    requests, _ = parse_request_file(body)
    engine_frame = CodePredictor.engine_frame
    first: dict[str, list[np.ndarray]] = {}
    for way in ("engine", "host"):
        CodePredictor.engine_frame = engine_frame if way == "engine" else (lambda *a, **k: None)
        runs = []
        for _ in range(args.runs):
            pipe = Pipeline(engine, engines=Engines(cuda_graphs=not args.no_cuda_graphs))
            runs.append([np.asarray(o.codes) for o in pipe.run(requests, batch_size=3)])
        first[way] = runs[0]
        for i, codes in enumerate(runs):
            print(f"{way} draws, run {i}: first difference from run 0 per row "
                  f"(row, frame, group): {first_differences(codes, runs[0])}", flush=True)  # fmt: skip
    CodePredictor.engine_frame = engine_frame
    print(f"engine run 0 against host run 0: {first_differences(first['engine'], first['host'])}")


if __name__ == "__main__":
    main()
