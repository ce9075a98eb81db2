"""The stateful vocoder's convolutions in int8 on this CPU: time a frame and SNR against float32
on the same codes (issue 53: "int8 or bfloat16 where its error stays below a stated bound").

A comparison only (edgeomni ships the float32 step): a built engine's ``code2wav_stream`` is
quantized with ONNX Runtime's own tools, each way a user could:

- ``dynamic``: ``quantize_dynamic`` (weights int8 per channel, activations quantized on the fly:
  ConvInteger);
- ``static``: ``quantize_static`` in QDQ form (weights int8 per channel, activations uint8 per
  tensor, their ranges calibrated on a stream of random codes from a zero state, MinMax), which
  ONNX Runtime fuses into QLinearConv with its full graph optimisation (the transposed
  convolutions stay float32: quantizing them too was slower and noisier in a trial run);

each run as a stream: chunks of 2, 4, 8, 16 and then 25 frames of other random codes, every
call's state carried to the next, the waveform compared with the float32 step's on the same
chunks (SNR in dB), and one 25-frame call from a zero state timed (best of ``--repeats``), at
the runtime's graph optimisation (basic) and at ONNX Runtime's full one (all). The weights are
random: a trained vocoder's activations have other ranges, so the SNR is this one's.

    python bench/vocoder_int8_cpu.py --engine ENG [--ways dynamic,static] [--threads 2]
        [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from vocoder_cpu import feeds  # noqa: E402 - one definition

CALIBRATION = (2, 4, 8, 16, 25, 25, 25, 25)  # frames a call: the runtime's chunks, growing
TEST = (2, 4, 8, 16, 25, 25, 20)
LEVELS = ("basic", "all")


def session(path: Path, threads: int, level: str) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]  # fmt: skip
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def stream(sess: Any, codes: np.ndarray, chunks: tuple[int, ...],
           seen: list[dict[str, np.ndarray]] | None = None) -> np.ndarray:  # fmt: skip
    """The waveform of ``codes`` [1, Q, n] vocoded chunk by chunk, each call's state the last
    call's new state (``seen``: every call's feeds, appended)."""
    outs = [o.name for o in sess.get_outputs()]
    state = {k: v for k, v in feeds(sess, 1, codes.shape[1]).items()
             if k not in ("codes", "chunk_lens")}  # fmt: skip
    names = list(state)
    at, waves = 0, []
    for n in chunks:
        f = {"codes": codes[:, :, at : at + n], "chunk_lens": np.array([n], np.int64), **state}
        if seen is not None:
            seen.append({k: v.copy() for k, v in f.items()})
        got = dict(zip(outs, sess.run(None, f), strict=True))
        waves.append(got["waveform"].reshape(-1))
        state = dict(zip(names, (got[f"next_{k}"] for k in names), strict=True))
        at += n
    return np.concatenate(waves)


def quantized(way: str, src: Path, out: Path, calibration: list[dict[str, np.ndarray]]) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if way == "dynamic":
        quantize_dynamic(str(src), str(out), op_types_to_quantize=["Conv"], per_channel=True,
                         weight_type=QuantType.QInt8)  # fmt: skip
        return

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.calls = iter(calibration)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.calls, None)

    quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["Conv"], per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    extra_options={"WeightSymmetric": True})  # fmt: skip


def timed(sess: Any, groups: int, repeats: int) -> float:
    """Milliseconds a frame of one 25-frame call from a zero state, the best of ``repeats``."""
    f = feeds(sess, 25, groups)
    sess.run(None, f)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run(None, f)
        best = min(best, time.perf_counter() - start)
    return best * 1e3 / 25


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--engine", type=Path, required=True, help="an engine dir with code2wav_stream/")
    p.add_argument("--ways", default="dynamic,static")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    folder = args.engine / "code2wav_stream"
    cfg = json.loads((folder / "config.json").read_text())
    src = folder / cfg["engine"]
    groups = int(cfg["num_quantizers"])
    size = int(cfg["codebook_size"])
    rng = np.random.default_rng(0)
    calib_codes = rng.integers(0, size, (1, groups, sum(CALIBRATION))).astype(np.int64)
    test_codes = rng.integers(0, size, (1, groups, sum(TEST))).astype(np.int64)
    ref_sess = session(src, args.threads, "basic")
    calibration: list[dict[str, np.ndarray]] = []
    stream(ref_sess, calib_codes, CALIBRATION, calibration)
    reference = stream(ref_sess, test_codes, TEST)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {"float32": src}
        for way in (w for w in args.ways.split(",") if w):
            models[way] = Path(tmp) / f"{way}.onnx"
            start = time.perf_counter()
            quantized(way, src, models[way], calibration)
            print(f"{way}: quantized in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        for level in LEVELS:
            for way, path in models.items():
                sess = session(path, args.threads, level)
                wave = stream(sess, test_codes, TEST)
                noise = float(np.sum((wave - reference) ** 2))
                snr = 10 * np.log10(float(np.sum(reference**2)) / noise) if noise else None
                rows.append({"way": way, "optimisation": level,  # None: the same samples
                             "snr_db": None if snr is None else round(snr, 2),
                             "ms_per_frame": round(timed(sess, groups, args.repeats), 2)})  # fmt: skip
                print(rows[-1], file=sys.stderr, flush=True)
    base = {r["optimisation"]: r["ms_per_frame"] for r in rows if r["way"] == "float32"}
    for r in rows:
        r["speedup_vs_float32_basic"] = round(base["basic"] / r["ms_per_frame"], 2)
    result = {"date": time.strftime("%Y-%m-%d"), "engine": str(args.engine),
              "threads": args.threads, "test_chunks": list(TEST),
              "calibration_chunks": list(CALIBRATION), "rows": rows}  # fmt: skip
    print(json.dumps(result, indent=2))
    print("\n| way | optimisation | SNR vs float32 | ms a frame (25-frame call) | "
          "vs float32 (basic) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for r in rows:
        snr = "equal" if r["snr_db"] is None else f"{r['snr_db']} dB"
        print(f"| {r['way']} | {r['optimisation']} | {snr} | {r['ms_per_frame']} | "
              f"{r['speedup_vs_float32_basic']}x |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
