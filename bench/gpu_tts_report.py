"""The report of bench/gpu_tts.py: the machine, the two sides' ratios, the targets and the
markdown table with its description.

Apart from gpu_tts.py to keep each file under the project's 800-line limit; it formats a
finished report dict and reads the machine, and runs no model.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from qwen3_tts_cpu import SAMPLES_PER_FRAME, SR, TEXT, compare_codes

REPO = Path(__file__).resolve().parent.parent

SIDES = ("edgeomni", "upstream")
# what the project wants to show at 0.6B on one H200 (not a measurement)
TARGETS = {"size": "0.6b", "rtf_p50_c1": 0.1, "ttfa_p50_ms_c1": 100.0, "audio_s_per_s_c32": 150.0}
# published figures, printed beside ours; not reproduced here (other hardware and setups)
PEERS = [
    {"name": "faster-qwen3-tts", "setup": "0.6B on an H100, its CUDA-graph path",
     "rtf_c1": 0.257, "first_audio_ms_c1": 228},
    {"name": "vLLM-Omni", "setup": "Qwen3-TTS", "rtf_c1": 0.155,
     "first_audio_ms_c1": 129, "first_audio_is": "first packet", "audio_s_per_s": 38.7,
     "audio_s_per_s_at_c": 16},
]  # fmt: skip


def machine() -> dict:
    info: dict[str, Any] = {"host": platform.node(), "arch": platform.machine(),
                            "cores": os.cpu_count(), "python": platform.python_version()}  # fmt: skip
    try:
        info["cpu"] = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, check=True, timeout=20,
        ).stdout.strip()  # fmt: skip
        info["gpus"] = smi.splitlines()
    except (OSError, subprocess.SubprocessError):
        info["gpus"] = []
    git = ["git", "-C", str(REPO)]
    try:  # the GPU machine's copy of the tree may have no .git (or no git)
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip()  # fmt: skip
        dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True,
                               check=False).stdout.strip()  # fmt: skip
    except OSError:
        head = dirty = ""
    info["edgeomni_commit"] = head + ("+dirty" if dirty else "") if head else None
    return info


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def comparisons(report: dict) -> dict[str, dict]:
    """Per concurrency: upstream / edgeomni for first audio and RTF, edgeomni / upstream for
    throughput (each > 1 where edgeomni is ahead)."""
    ed, up = report["sides"].get("edgeomni"), report["sides"].get("upstream")
    out: dict[str, dict] = {}
    for c in report["config"]["concurrency"]:
        e = ed and ed["runs"].get(str(c), {}).get("summary")
        u = up and up["runs"].get(str(c), {}).get("summary")
        if e and u and e.get("requests") and u.get("requests"):
            out[str(c)] = {
                "first_audio_upstream_over_edgeomni": ratio(u["ttfa_p50_ms"], e["ttfa_p50_ms"]),
                "rtf_upstream_over_edgeomni": ratio(u["rtf_p50"], e["rtf_p50"]),
                "throughput_edgeomni_over_upstream": ratio(e["audio_s_per_s"], u["audio_s_per_s"]),
            }
    return out


def same_codes(report: dict) -> dict | None:
    """Whether the two sides' c=1 codes agree (greedy; the same only where the dtypes are)."""
    try:
        a = report["sides"]["edgeomni"]["runs"]["1"]["codes"]
        b = report["sides"]["upstream"]["runs"]["1"]["codes"]
    except (KeyError, TypeError):
        return None
    return compare_codes(a, b)


def target_lines(report: dict) -> list[str]:
    size = report["config"]["size"]
    rows = []
    for side in SIDES:
        s = report["sides"].get(side)
        if not s:
            continue
        c1 = s["runs"].get("1", {}).get("summary", {})
        c32 = s["runs"].get("32", {}).get("summary", {})

        def check(value: float | None, ok: bool, fmt: str) -> str:
            return (
                "not measured"
                if value is None
                else f"{fmt.format(value)} ({'met' if ok else 'not met'})"
            )

        rtf, ttfa, thr = c1.get("rtf_p50"), c1.get("ttfa_p50_ms"), c32.get("audio_s_per_s")
        rows.append(
            f"| {side} | {check(rtf, rtf is not None and rtf <= TARGETS['rtf_p50_c1'], '{:.3f}')} "
            f"| {check(ttfa, ttfa is not None and ttfa < TARGETS['ttfa_p50_ms_c1'], '{:.1f} ms')} "
            f"| {check(thr, thr is not None and thr >= TARGETS['audio_s_per_s_c32'], '{:.1f}')} |"
        )  # fmt: skip
    head = (f"Targets (at {TARGETS['size']} on one H200; this run: {size}, "
            f"{report['machine'].get('gpus') or 'no GPU'}):")  # fmt: skip
    return [head, "", "| side | RTF p50 c=1 <= 0.1 | first audio p50 c=1 < 100 ms | "
            "audio-s/s c=32 >= 150 |", "|---|---|---|---|", *rows]  # fmt: skip


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(report: dict) -> str:
    cfg = report["config"]
    frames = cfg["frames"]
    gpu = ", ".join(report["machine"].get("gpus") or []) or f"CPU ({report['machine']['cpu']})"
    win = cfg["windows"]
    up_cfg = f"{cfg['upstream_dtype']}, attn {cfg['upstream_attn']}"
    quant = cfg.get("quantization")
    quant_s = f" with {quant} group {cfg.get('group_size')} weights" if quant else ""
    lines = [
        f"Qwen3-TTS {cfg['size']} CustomVoice, random weights, on {gpu} ({report['date']})"
        f"{'; edgeomni ' + quant + ' g' + str(cfg.get('group_size')) if quant else ''}: "
        f"{frames} frames a request ({frames * SAMPLES_PER_FRAME / SR:.2f} s of audio), "
        f"{'sampled (release defaults)' if cfg['sampled'] else 'greedy'}, c requests submitted "
        f"together; p50 over requests pooled over {cfg['repeats']} (edgeomni) / "
        f"{cfg['upstream_repeats']} (upstream) timed runs after {cfg['warmup']} warm-up.",
        "",
        "| c | side | first audio p50 ms | first audio max ms | RTF p50 | audio-s/s | "
        "wall p50 ms | stall max ms | frames |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cfg["concurrency"]:
        for side in SIDES:
            s = report["sides"].get(side)
            if s is None:
                continue
            run = s["runs"].get(str(c))
            if run is None:
                lines.append(f"| {c} | {side} | not measured | | | | | | |")
                continue
            m = run["summary"]
            if not m.get("requests"):
                lines.append(f"| {c} | {side} | failed | | | | | | |")
                continue
            first = fmt(m["ttfa_p50_ms"]) + (" (= wall)" if side == "upstream" else "")
            ok = "ok" if m["fixed_work"] and m["ok"] else f"NOT {frames}: {m['frames']}"
            lines.append(
                f"| {c} | {side} | {first} | {fmt(m['ttfa_max_ms'])} | {fmt(m['rtf_p50'], 3)} | "
                f"{fmt(m['audio_s_per_s'])} | {fmt(m['wall_ms_p50'], 0)} | "
                f"{fmt(m.get('stall_max_ms'))} | {ok} |"
            )
    lines += ["", "| c | first audio upstream / edgeomni | RTF upstream / edgeomni | "
              "audio-s/s edgeomni / upstream |", "|---|---|---|---|"]  # fmt: skip
    for c, r in report["comparisons"].items():
        lines.append(
            f"| {c} | {fmt(r['first_audio_upstream_over_edgeomni'], 2)}x | "
            f"{fmt(r['rtf_upstream_over_edgeomni'], 2)}x | "
            f"{fmt(r['throughput_edgeomni_over_upstream'], 2)}x |"
        )
    lines += ["", *target_lines(report), "", "Published peers (not reproduced here):", ""]
    for p in PEERS:
        extra = (f"; {p['audio_s_per_s']} audio-s/s at c={p['audio_s_per_s_at_c']}"
                 if "audio_s_per_s" in p else "")  # fmt: skip
        lines.append(f"- {p['name']} ({p['setup']}): c=1 {p.get('first_audio_is', 'first audio')} "
                     f"{p['first_audio_ms_c1']} ms, RTF {p['rtf_c1']}{extra}")  # fmt: skip
    codes = report.get("same_codes_c1")
    codes_s = ("n/a" if codes is None else "yes" if codes["same"]
               else f"no (from frame {codes['first_differing_frame']})")  # fmt: skip
    ed_meta = report["sides"].get("edgeomni", {}).get("meta", {})
    up_meta = report["sides"].get("upstream", {}).get("meta", {})
    lines += [
        "",
        f"- edgeomni: edge-build engines on {cfg['device']} ({cfg['dtype']} talker and code "
        f"predictor{quant_s}, float32 code2wav; built for batch {cfg['limits']['max_batch_size']}, "
        f"input {cfg['limits']['max_input_len']}, KV {cfg['limits']['max_kv_cache_capacity']}), "
        f"ONNX Runtime {ed_meta.get('versions', {}).get('onnxruntime', '?')}, Pipeline "
        f"{json.dumps(ed_meta.get('pipeline_options', {}))}; vocoder "
        + (
            f"stateful: each frame decoded once, first chunk {win.get('first_chunk_frames')} "
            f"frames, doubling to {win.get('chunk_frames')}. "
            if win.get("streaming") == "stateful"
            else f"windows: first {win.get('first_window_frames')} frames, doubling to "
            f"{win.get('window_frames')} (left context {win.get('left_context_frames')}). "
            if win
            else "windows: - (no engine). "
        )
        + "First audio: each request's "
        "first AudioChunk with samples, from the submission; RTF: its last event / its audio.",
        f"- upstream: qwen-tts {up_meta.get('versions', {}).get('qwen-tts', '?')} on transformers "
        f"{up_meta.get('versions', {}).get('transformers', '?')}, torch "
        f"{up_meta.get('versions', {}).get('torch', '?')}, {up_cfg}, one generate_custom_voice "
        "call of c texts (a batch, left-padded); it returns whole audio only, so first audio = "
        "the call's wall time and RTF = wall / audio.",
        f"- both: the same checkpoint and text ({len(TEXT)} characters), non-streaming text mode, "
        "repetition penalty 1.05, the codec EOS row zeroed (exactly the frames asked for). "
        f"Same codes at c=1: {codes_s} (expected only where both sides run the same dtype). "
        "Random weights: speed, not quality.",
    ]
    for side in SIDES:
        s = report["sides"].get(side)
        if s and (s["missing"] or s["error"]):
            why = (s["error"] or "").splitlines()[0][:200] if s["error"] else "not run"
            lines.append(f"- {side}: not measured at c={s['missing']}: {why}")
    return "\n".join(lines) + "\n"
