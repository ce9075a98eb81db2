"""GPU probe: the thinker's host time at 1 and 32 rows: its prefill (the call's wall time minus
the engine's) and each decode step, then cProfile of the 32-row prefill call, the decode calls
and the whole thinker loop. Any Qwen3-Omni engine dir built for 32 requests and cuda works; the
slice that found numpy's float32 -> float16 casts used a real-width thinker (hidden 2048,
vocabulary 152064, 2 layers of 4 small experts) to keep the build short.

    python bench/probes/thinker_host.py ENGINE_DIR REQUESTS_JSON   (32 requests)
"""

from __future__ import annotations

import cProfile
import json
import pstats
import sys
from pathlib import Path

from edgeomni.runtime import decoder
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file
from edgeomni.runtime.runners import llm


def main(engine: Path, requests_json: Path) -> None:
    body = json.loads(requests_json.read_text())
    body.update(max_generate_length=64, min_generate_length=64)
    for request in body["requests"]:  # the talker only as far as it must go
        request["sampling"] = {"talker_max_new_tokens": 2, "talker_min_new_tokens": 1}
    pipe = Pipeline(engine)
    requests, _ = parse_request_file(body)
    for n in (1, 32, 32):
        t = pipe.run(requests[:n], batch_size=n)[0].entry["stages"]["thinker"]
        host = (t["decode_ms"] - t["decode_engine_ms"]) / t["decode_steps"] * 1e3
        print(f"rows {n}: prefill {t['prefill_ms']} ms (engine {t['prefill_engine_ms']}); "
              f"decode host/step {host:.0f} us", flush=True)  # fmt: skip

    run = decoder.DecoderSession.run
    prefill, decode = cProfile.Profile(), cProfile.Profile()

    def profiled(self, embeds, *args, **kwargs):
        if self.rows != 32 or "hidden_states" not in self._shapes:
            return run(self, embeds, *args, **kwargs)
        profile = prefill if embeds.shape[1] > 1 else decode
        profile.enable()
        try:
            return run(self, embeds, *args, **kwargs)
        finally:
            profile.disable()

    decoder.DecoderSession.run = profiled
    pipe.run(requests, batch_size=32)
    decoder.DecoderSession.run = run
    for title, profile in (("prefill call", prefill), ("decode calls", decode)):
        print(f"=== {title}")
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(14)

    whole, steps = cProfile.Profile(), llm.LLMBackbone.steps

    def profiled_steps(self, cohort):
        inner = steps(self, cohort)
        while True:
            whole.enable()
            try:
                next(inner)
            except StopIteration:
                return
            finally:
                whole.disable()
            yield

    llm.LLMBackbone.steps = profiled_steps
    pipe.run(requests, batch_size=32)
    llm.LLMBackbone.steps = steps
    print("=== thinker steps")
    pstats.Stats(whole, stream=sys.stdout).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
