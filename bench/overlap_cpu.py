"""Would the vocoder overlap the decoders on a 2-core CPU? The engines of a built Qwen3-TTS
engine dir, alone (no pipeline), in the two arrangements:

- one after the other, every engine on both cores (what the runtime's one loop does today):
  ``--frames`` frames of a talker step and a code predictor frame call, then one vocoder call
  of those frames;
- side by side: the talker and code predictor on one core in one thread, the vocoder on the
  other in a second thread, vocoding the window before while the decoders make the next
  (ONNX Runtime releases the GIL inside a run).

Sessions as the runtime opens engines that take turns (basic graph optimisation, threads that
do not spin). Per frame, the best of ``--repeats`` windows each way, alternating. Decoder inputs are random,
the KV cache at ``--past`` positions, the vocoder's state zero (times do not depend on values).

    python bench/overlap_cpu.py --engine ENG [--frames 25] [--repeats 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from vocoder_cpu import feeds as vocoder_feeds  # noqa: E402
from vocoder_cpu import session  # noqa: E402


class Decoders:
    """The talker's decode step and the code predictor's frame call, on ``threads`` threads."""

    def __init__(self, engine: Path, threads: int, past: int) -> None:
        import onnxruntime as ort

        cfg = json.loads((engine / "talker" / "config.json").read_text())
        cp_cfg = json.loads((engine / "code_predictor" / "config.json").read_text())
        if cp_cfg.get("calls") != "frame":
            raise SystemExit(f"{engine}: its code predictor is not a frame engine")
        capacity = int(cfg["builder_config"]["max_kv_cache_capacity"])
        width = int(cfg["hidden_size"])
        rng = np.random.default_rng(0)
        self.talker = session(engine / "talker" / cfg["engine"], threads, spin=False)
        self.binding = self.talker.io_binding()
        self.keep = []
        step = {"inputs_embeds": rng.standard_normal((1, 1, width)).astype(np.float32) * 0.1,
                "position_ids": np.array([[past]], np.int64),
                "past_lens": np.array([past], np.int32), "query_lens": np.array([1], np.int32),
                "last_indices": np.array([0], np.int64)}  # fmt: skip
        for i in self.talker.get_inputs():
            if i.name in step:
                self.binding.bind_cpu_input(i.name, step[i.name])
            elif i.name.startswith("past_"):
                kv = ort.OrtValue.ortvalue_from_numpy(
                    np.zeros((1, i.shape[1], capacity, i.shape[3]), np.float32))  # fmt: skip
                self.keep.append(kv)
                self.binding.bind_ortvalue_input(i.name, kv)
                self.binding.bind_ortvalue_output(i.name.replace("past_", "present_"), kv)
        for o in self.talker.get_outputs():
            if not o.name.startswith("present_"):
                self.binding.bind_output(o.name)
        self.cp = session(engine / "code_predictor" / cp_cfg["engine"], threads, spin=False)
        groups, vocab = int(cp_cfg["num_code_groups"]), int(cp_cfg["vocab_size"])
        cp_width = int(cp_cfg.get("input_size") or cp_cfg["hidden_size"])
        self.cp_feeds = {
            "talker_hidden": rng.standard_normal((1, 1, cp_width)).astype(np.float32),
            "first_embeds": rng.standard_normal((1, 1, cp_width)).astype(np.float32),
            "sample_uniform": np.zeros((groups - 1, 1)), "sample_temperature": np.ones(1),
            "sample_top_k": np.ones(1, np.int64), "sample_top_p": np.ones(1),
            "code_tables": np.zeros((groups - 1, vocab, cp_width), np.float32),
        }  # fmt: skip

    def frames(self, n: int) -> None:
        for _ in range(n):
            self.talker.run_with_iobinding(self.binding)
            self.cp.run(None, self.cp_feeds)


def window(decoders: Decoders, vocoder: Any, vfeeds: dict, frames: int, overlap: bool) -> float:
    """One window's wall seconds: its frames' decoders and one vocoder call of as many frames."""
    start = time.perf_counter()
    if overlap:
        worker = threading.Thread(target=vocoder.run, args=(None, vfeeds))
        worker.start()
        decoders.frames(frames)
        worker.join()
    else:
        decoders.frames(frames)
        vocoder.run(None, vfeeds)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--engine", type=Path, required=True)
    p.add_argument("--frames", type=int, default=25, help="frames a window (a vocoder call)")
    p.add_argument("--past", type=int, default=100, help="the talker's cached positions")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    stream = args.engine / "code2wav_stream"
    vcfg = json.loads((stream / "config.json").read_text())
    vpath = stream / vcfg["engine"]
    groups = int(vcfg.get("num_quantizers", 16))
    ways = {
        "one after the other, 2 threads each": (Decoders(args.engine, 2, args.past),
                                                session(vpath, 2, spin=False), False),
        "side by side, 1 thread each": (Decoders(args.engine, 1, args.past),
                                        session(vpath, 1, spin=False), True),
    }  # fmt: skip
    vfeeds = {name: vocoder_feeds(w[1], args.frames, groups) for name, w in ways.items()}
    for name, (dec, voc, overlap) in ways.items():  # warm-up
        window(dec, voc, vfeeds[name], 2, overlap)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(args.repeats):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            dec, voc, overlap = ways[name]
            times[name].append(window(dec, voc, vfeeds[name], args.frames, overlap))
    rows = {name: {"ms_per_frame": round(min(t) / args.frames * 1e3, 2),
                   "windows_ms": [round(x * 1e3, 1) for x in t]} for name, t in times.items()}  # fmt: skip
    first, second = (rows[n]["ms_per_frame"] for n in ways)
    result = {"date": time.strftime("%Y-%m-%d"), "engine": str(args.engine),
              "frames": args.frames, "past": args.past, "rows": rows,
              "speedup": round(first / second, 3)}  # fmt: skip
    print(json.dumps(result, indent=2))
    print("\n| arrangement | ms a frame (decoders and vocoder) |")
    print("|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['ms_per_frame']} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
