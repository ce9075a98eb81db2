"""The report of bench/gpu_omni.py: machine and versions, the markdown table and its
description, and the JSON's cleanup.

Apart from gpu_omni.py to keep each file under the project's 800-line limit; it formats a
finished result dict and reads the machine's versions, and runs no model.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from gpu_common import FRAME_S, PEERS, REAL_THINKER_LAYERS, SPEAKER


# -- report ----------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    import onnxruntime as ort

    info: dict[str, Any] = {
        "host": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "onnxruntime_providers": ort.get_available_providers(),
    }
    try:
        import torch
        import transformers

        info["torch"] = torch.__version__
        info["transformers"] = transformers.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    try:
        here = Path(__file__).parent
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, check=True
        ).stdout
        info["git_dirty"] = bool(dirty.strip())
    except (OSError, subprocess.CalledProcessError):
        info["git_commit"] = None
    return info


def fmt(value: Any, unit: str = "") -> str:
    """Milliseconds to 0.1 below 100 and whole above; ratios to three digits (0.123, 12.3)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if unit == " ms":
            digits = 1 if abs(value) < 100 else 0
        else:
            digits = 3 if abs(value) < 10 else 1 if abs(value) < 100 else 0
        value = f"{value:.{digits}f}"
    return f"{value}{unit}"


def describe(result: dict[str, Any]) -> str:
    """What was measured, in the words a reader of the table needs."""
    cfg = result["config"]
    layers = cfg["thinker_layers"]
    if cfg["size"] == "real":
        size = (
            f"Qwen3-Omni-30B-A3B per-layer dimensions, thinker {layers} of "
            f"{REAL_THINKER_LAYERS} layers"
        )
        if layers < REAL_THINKER_LAYERS:
            size += (
                f" (**reduced**; the talker reads thinker layer {cfg['accept_hidden_layer']} "
                "instead of 24)"
            )
        size += "; talker, code predictor and code2wav at full size"
    else:
        size = "`--size tiny` (make_qwen3_omni's defaults: a logic check, not a speed figure)"
    talker = (
        "greedy"
        if cfg["greedy_talker"]
        else "transformers' defaults on both sides (edgeomni seeded; the codes differ between "
        "the two, which a speed bench allows)"
    )
    hf = result.get("transformers") or {}
    topk = cfg["build_args"].get("logits_topk")
    options = (result.get("edgeomni") or {}).get("pipeline_options") or {}
    streaming = bool(options.get("stream_stages"))
    return " ".join([
        f"{size}. Random weights; audio and vision encoders tiny and not built by edgeomni "
        "(text to speech does not use them).",
        f"Per request: a {cfg['prompt_tokens_p50']}-token ChatML prompt, {cfg['new_tokens']} "
        f"greedy thinker tokens, {cfg['frames']} codec frames "
        f"({cfg['frames'] * FRAME_S:.1f} s of audio), speaker {SPEAKER}; talker sampling "
        f"{talker}.",
        f"edgeomni: {cfg['engine_dtype']} engines on ONNX Runtime ({cfg['engine_device']}"
        + (f", top-{topk} logits from the engine" if topk else "")
        + (
            "), the stateful vocoder step (each frame decoded once; first chunk "
            f"{cfg.get('first_chunk_frames') or 'the build default'}, then doubling)"
            if cfg.get("code2wav_streaming") == "stateful"
            else f"), vocoder windows of {cfg['window_frames']} frames (the first "
            f"{cfg.get('first_window_frames', cfg['window_frames'])}, then doubling up to the "
            "full size)"
        )
        + ", c requests submitted together"
        + ("; the talker streams the thinker's reply (--stage-streaming)." if streaming else "."),
        f"transformers: {hf.get('dtype', '-')}, sdpa, one request at a time; its first audio "
        "is its wall time (generate returns all audio at the end).",
    ])  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    layers = cfg["thinker_layers"]
    rows: list[tuple[str, dict[str, Any]]] = []
    for c, run in (result.get("edgeomni") or {}).get("runs", {}).items():
        rows.append((f"edgeomni c={c}", run["summary"]))
    if result.get("transformers"):
        rows.append(("transformers c=1", result["transformers"]["summary"]))
    m = result["machine"]
    lines = [
        f"### Qwen3-Omni text to speech, {m.get('gpu') or m['host']} ({result['date']})",
        "",
        describe(result),
        "",
        "| run | TTFA p50 | TTFA max | stall max | RTF p50 | audio-s/s | thinker | talker+cp |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        if not s.get("ok", True) and "ttfa_p50_ms" not in s:
            lines.append(f"| {name} | failed | | | | | | |")
            continue
        lines.append(
            f"| {name} | {fmt(s['ttfa_p50_ms'], ' ms')} | {fmt(s['ttfa_max_ms'], ' ms')} | "
            f"{fmt(s.get('stall_max_ms'), ' ms')} | {fmt(s['rtf_p50'])} | "
            f"{fmt(s['audio_s_per_s'])} | {fmt(s['thinker_ms'], ' ms')} | "
            f"{fmt(s['talker_cp_ms'], ' ms')} |"
        )
    streaming = bool(((result.get("edgeomni") or {}).get("pipeline_options") or {}).get(
        "stream_stages"))  # fmt: skip
    if layers < REAL_THINKER_LAYERS and streaming:
        lines += [
            "",
            f"No estimate scaled to {REAL_THINKER_LAYERS} thinker layers: with stage streaming "
            "the thinker's steps are spread over the talker's frames, which scaling the thinker "
            "time does not model.",
        ]
    elif layers < REAL_THINKER_LAYERS:
        lines += [
            "",
            f"**Scaled to {REAL_THINKER_LAYERS} thinker layers (ESTIMATE, not measured):** "
            f"the thinker's time inside its engine calls is scaled by {REAL_THINKER_LAYERS}/"
            f"{layers} (transformers: its whole thinker time), the rest as measured. The LM "
            "head and logits top-K inside the engine are scaled too though they do not grow "
            "with layers, so it overstates edgeomni's thinker.",
            "",
            "| run (estimate) | TTFA p50 | RTF p50 | audio-s/s | thinker |",
            "|---|---|---|---|---|",
        ]
        for name, s in rows:
            e = s.get("scaled48_estimate")
            if e:
                lines.append(
                    f"| {name} | {fmt(e['ttfa_p50_ms'], ' ms')} | {fmt(e['rtf_p50'])} | "
                    f"{fmt(e['audio_s_per_s'])} | {fmt(e['thinker_ms'], ' ms')} |"
                )
    p = PEERS
    lines += [
        "",
        "TTFA: from submitting the batch to the request's first vocoded audio. stall: how long "
        "a player that starts at the first audio and plays the pieces as they come would wait "
        "for later ones, the worst request (transformers: 0, all audio comes at once, at "
        "TTFA). RTF: a request's "
        "wall time (a batch returns together) / its audio seconds. audio-s/s: all audio / all "
        "wall. thinker: prefill + decode of the batch. talker+cp: talker and code "
        "predictor, without the vocoder windows edgeomni streams inside the talker's loop "
        "(transformers: talker.generate).",
        "",
        f"For context, {p['source']}: RTF p50 {p['rtf_p50_c1']} and first audio "
        f"{p['ttfa_p50_ms_c1']} ms at one request, {p['audio_s_per_s_c32']} audio-s/s at 32.",
    ]
    notes = []
    if result.get("same_codes_greedy_c1") is not None:
        same = "yes" if result["same_codes_greedy_c1"] else "**no**"
        notes.append(f"greedy talker: edgeomni's codes equal transformers' at c=1: {same}")
    bad = [n for n, s in rows if not s.get("fixed_work", True)]
    if bad:
        notes.append(f"**work not as requested** (token or frame counts differ): {', '.join(bad)}")
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def strip_private(obj: Any) -> Any:
    """Drop the raw code arrays (keys starting with '_') from the JSON."""
    if isinstance(obj, dict):
        return {k: strip_private(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, list):
        return [strip_private(v) for v in obj]
    return obj
