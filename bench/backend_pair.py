"""Two backends in one run of a pipeline benchmark (bench/gpu_tts.py, bench/gpu_omni.py
``--backend onnxruntime fused``): each backend's engines are built and measured in turn by the
script's own code, in the same lease, then this module prints them side by side with the ratios
and each run's fraction of the HBM bound.

The HBM bound of a run is the time the GPU needs just to read what the decoder steps must read,
at the measured device copy bandwidth: per codec frame the talker's weights once, the code
predictor's 15 times (each step one of its 15 heads), per thinker token the thinker's weights;
a mixture-of-experts layer reads the experts its rows route to (E (1 - (1 - k/E)^c) distinct
experts of E for c rows of top-k, uniform routing), and each step reads the KV cache its rows
hold. The requests of a run go in lockstep, so a run of c requests, N thinker tokens and F
frames each cannot take less than (N * token_bytes(c) + F * frame_bytes(c)) / bandwidth; its
bound in audio-s/s is the audio of the c requests over that. The vocoder (compute-bound
convolutions), the prefills and the embedding lookups are left out, and Qwen3-TTS's talker
prompt is left out of its KV (the script does not know the prompt's length): the bound is a
lower bound on the time, the fraction an upper bound on how close a run came. Standard library
only (torch, where present, measures the bandwidth).
"""

from __future__ import annotations

import json
import re
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BACKENDS = ("onnxruntime", "fused")
BYTES = 2  # float16 engines: a weight and a KV value each
EXPERT = re.compile(r"\.experts\.(\d+)\.")


def run_backends(main: Callable[[list[str]], int], argv: Sequence[str], backends: Sequence[str],
                 out: Path, later: Sequence[str] = ()) -> dict[str, int]:  # fmt: skip
    """Run the script's ``main`` once a backend (its out folder OUT/<backend>; ``later``: extra
    arguments for every run after the first); the exit status of each. The arguments given last
    win in argparse, so the script's own flags stay as they were."""
    codes: dict[str, int] = {}
    for i, backend in enumerate(backends):
        extra = list(later) if i else []
        print(f"[backends] {backend}: {i + 1} of {len(backends)}", flush=True)
        codes[backend] = main([*argv, *extra, "--backend", backend, "--out", str(out / backend)])
    return codes


# -- what a step reads ---------------------------------------------------------------------------
def tensor_shapes(ckpt: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the checkpoint's top-level safetensors files (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(ckpt).glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(info["shape"])
    if not shapes:
        raise FileNotFoundError(f"{ckpt}: no *.safetensors")
    return shapes


def count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def distinct_experts(experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts ``rows`` rows route to, top-k each, uniform routing."""
    return experts * (1.0 - (1.0 - top_k / experts) ** rows)


def decoder_bytes(shapes: dict[str, tuple[int, ...]], prefix: str, top_k: int, rows: int,
                  extra: Sequence[str] = ()) -> float:  # fmt: skip
    """What one step of ``rows`` rows reads of the weights under ``prefix``'s layers and final
    norm plus the tensors named in ``extra`` (heads, projections): experts by their expected
    share (per-expert tensors ``.experts.N.``, or stacked ones with experts first)."""
    layers = prefix + "model.layers."
    per_expert = [n for n in shapes if n.startswith(layers) and EXPERT.search(n)]
    experts = len({EXPERT.search(n).group(1) for n in per_expert}) if per_expert else 0
    total = 0.0
    for name, shape in shapes.items():
        if name in extra or name == prefix + "model.norm.weight":
            total += count(shape)
        elif not name.startswith(layers):
            continue
        elif EXPERT.search(name):
            total += count(shape) * distinct_experts(experts, top_k, rows) / experts
        elif ".experts." in name and len(shape) == 3:  # stacked: (experts, out, in)
            total += count(shape) * distinct_experts(shape[0], top_k, rows) / shape[0]
        else:
            total += count(shape)
    return total * BYTES


def kv_bytes(cfg: dict[str, Any], positions: float) -> float:
    """The KV cache one row of ``positions`` positions holds (float16)."""
    return (
        2
        * cfg["num_hidden_layers"]
        * cfg["num_key_value_heads"]
        * cfg["head_dim"]
        * positions
        * BYTES
    )


def code_predictor_bytes(shapes: dict[str, tuple[int, ...]], prefix: str, cfg: dict[str, Any],
                         rows: int) -> float:  # fmt: skip
    """A frame of the code predictor: its groups - 1 steps, each the layers and one head (all
    heads once in all), with the KV of ~groups / 2 positions a row."""
    steps = cfg["num_code_groups"] - 1
    heads = [n for n in shapes if n.startswith(prefix + "lm_head.")]
    proj = [n for n in shapes if n.startswith(prefix + "small_to_mtp_projection.")]
    layers = decoder_bytes(shapes, prefix, 1, rows, proj)
    return (steps * layers + sum(count(shapes[n]) for n in heads) * BYTES
            + steps * rows * kv_bytes(cfg, (steps + 1) / 2))  # fmt: skip


def tts_traffic(ckpt: Path, rows: int, frames: int) -> dict[str, float]:
    """Qwen3-TTS: bytes a codec frame of ``rows`` rows reads (the talker's step and the code
    predictor's frame), the KV at the middle of ``frames`` frames; no thinker."""
    shapes = tensor_shapes(ckpt)
    talker = json.loads((Path(ckpt) / "config.json").read_text())["talker_config"]
    cp = {**talker["code_predictor_config"], "num_code_groups": talker["num_code_groups"]}
    step = decoder_bytes(shapes, "talker.", 1, rows, ("talker.codec_head.weight",))
    step += rows * kv_bytes(talker, frames / 2)
    return {"token_bytes": 0.0, "frame_bytes": step + code_predictor_bytes(
        shapes, "talker.code_predictor.", cp, rows)}  # fmt: skip


def omni_traffic(ckpt: Path, rows: int, frames: int, tokens: int, prompt: int) -> dict[str, float]:
    """Qwen3-Omni: bytes a thinker token and a codec frame of ``rows`` rows read, the KV at the
    middle of the prompt + ``tokens`` (thinker) and prompt + ``frames`` (talker)."""
    shapes = tensor_shapes(ckpt)
    config = json.loads((Path(ckpt) / "config.json").read_text())
    thinker = config["thinker_config"]["text_config"]
    talker_top = config["talker_config"]
    talker = talker_top["text_config"]
    cp = {**talker_top["code_predictor_config"], "num_code_groups": talker_top["num_code_groups"]}
    token = decoder_bytes(shapes, "thinker.", thinker["num_experts_per_tok"], rows,
                          ("thinker.lm_head.weight",))  # fmt: skip
    token += rows * kv_bytes(thinker, prompt + tokens / 2)
    projections = tuple(n for n in shapes if n.startswith(("talker.text_projection.",
                                                           "talker.hidden_projection.")))  # fmt: skip
    step = decoder_bytes(shapes, "talker.", talker["num_experts_per_tok"], rows,
                         ("talker.codec_head.weight", *projections))  # fmt: skip
    step += rows * kv_bytes(talker, prompt + frames / 2)
    return {"token_bytes": token, "frame_bytes": step + code_predictor_bytes(
        shapes, "talker.code_predictor.", cp, rows)}  # fmt: skip


def bound_audio_s_per_s(traffic: dict[str, float], rows: int, tokens: int, frames: int,
                        audio_s: float, bandwidth_gbs: float) -> float:  # fmt: skip
    """The most audio-s/s ``rows`` requests in lockstep can make when each step only reads."""
    seconds = (tokens * traffic["token_bytes"] + frames * traffic["frame_bytes"]) / (
        bandwidth_gbs * 1e9
    )
    return rows * audio_s / seconds


def copy_bandwidth_gbs() -> float | None:
    """The device's copy bandwidth (read + write), GB/s; None without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    src = torch.empty(1 << 29, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (1 << 29) * 4 / best / 1e9


# -- the table -----------------------------------------------------------------------------------
def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def compare(runs: dict[str, dict[str, dict[str, Any]]], traffic: Callable[[int], dict],
            tokens: int, frames: int, bandwidth_gbs: float | None) -> list[dict[str, Any]]:  # fmt: skip
    """Rows per concurrency: each backend's summary figures, the fused over ONNX Runtime
    ratios (each > 1 where fused is ahead) and each backend's fraction of the HBM bound.
    ``runs``: backend -> concurrency (str) -> summary (ttfa_p50_ms, rtf_p50, audio_s_per_s,
    audio_s_per_request)."""
    cs = sorted({int(c) for r in runs.values() for c in r})
    rows = []
    for c in cs:
        row: dict[str, Any] = {"c": c}
        bound = None
        for backend, by_c in runs.items():
            s = by_c.get(str(c))
            if not s or not s.get("requests"):
                row[backend] = None
                continue
            if bound is None and bandwidth_gbs:
                bound = bound_audio_s_per_s(traffic(c), c, tokens, frames,
                                            s["audio_s_per_request"], bandwidth_gbs)  # fmt: skip
            row[backend] = {
                "ttfa_p50_ms": s["ttfa_p50_ms"], "rtf_p50": s["rtf_p50"],
                "audio_s_per_s": s["audio_s_per_s"],
                "hbm_fraction": round(s["audio_s_per_s"] / bound, 3) if bound else None,
            }  # fmt: skip
        row["bound_audio_s_per_s"] = None if bound is None else round(bound, 1)
        o, f = row.get("onnxruntime"), row.get("fused")
        if o and f:
            row["first_audio_onnxruntime_over_fused"] = ratio(o["ttfa_p50_ms"], f["ttfa_p50_ms"])
            row["rtf_onnxruntime_over_fused"] = ratio(o["rtf_p50"], f["rtf_p50"])
            row["audio_s_per_s_fused_over_onnxruntime"] = ratio(f["audio_s_per_s"],
                                                                o["audio_s_per_s"])  # fmt: skip
        rows.append(row)
    return rows


def markdown(title: str, rows: list[dict[str, Any]], bandwidth_gbs: float | None) -> str:
    def cell(v: Any, digits: int = 1) -> str:
        return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    lines = [title, "",
             "| c | backend | first audio p50 ms | RTF p50 | audio-s/s | of the HBM bound |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        for backend in BACKENDS:
            s = r.get(backend)
            if s is None:
                lines.append(f"| {r['c']} | {backend} | not measured | | | |")
                continue
            frac = s["hbm_fraction"]
            lines.append(f"| {r['c']} | {backend} | {cell(s['ttfa_p50_ms'])} | "
                         f"{cell(s['rtf_p50'], 3)} | {cell(s['audio_s_per_s'])} | "
                         f"{'-' if frac is None else f'{100 * frac:.1f}%'} |")  # fmt: skip
    lines += ["", "| c | first audio ONNX Runtime / fused | RTF ONNX Runtime / fused | "
              "audio-s/s fused / ONNX Runtime | HBM bound audio-s/s |", "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        times = [r.get(k) for k in ("first_audio_onnxruntime_over_fused",
                                    "rtf_onnxruntime_over_fused",
                                    "audio_s_per_s_fused_over_onnxruntime")]  # fmt: skip
        cells = " | ".join("-" if v is None else f"{v:.2f}x" for v in times)
        lines.append(f"| {r['c']} | {cells} | {cell(r['bound_audio_s_per_s'])} |")
    bw = "no GPU: no bound" if not bandwidth_gbs else f"{bandwidth_gbs:.0f} GB/s copy bandwidth"
    lines += ["", f"Ratios > 1: fused ahead. HBM bound: {bw}; what the decoder steps must read "
              "(bench/backend_pair.py says what is counted), a lower bound on the time."]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_pair(out: Path, name: str, title: str, rows: list[dict[str, Any]],
          bandwidth_gbs: float | None, codes: dict[str, int], extra: dict[str, Any]) -> str:  # fmt: skip
    """OUT/<name>.json and OUT/<name>.md; the markdown, also printed."""
    text = markdown(title, rows, bandwidth_gbs)
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "copy_bandwidth_gbs": bandwidth_gbs,
        "exit_codes": codes, "rows": rows, **extra}, indent=2) + "\n")  # fmt: skip
    print("\n" + text, flush=True)
    return text
