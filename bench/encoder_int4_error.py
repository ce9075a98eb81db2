"""How far --quantize-encoders moves the encoders' features: the tiny random Qwen3-Omni's audio
and vision encoders built float and int4 (int4_rtn g32, --quantize-encoders), one request with
the same audio clip and image through each, every encoder output compared (relative L2 error).

Random weights show the size of the perturbation, not what it does to answers.

    python bench/encoder_int4_error.py [--work DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ENCODER_OUTPUTS = ("last_hidden_state", "image_embeds")  # the audio and vision engines' first


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "encoder-int4")
    args = p.parse_args()
    import soundfile as sf
    from PIL import Image

    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.tiny_omni import make_qwen3_omni
    from edgeomni.runtime import cli
    from edgeomni.runtime import engine as runtime_engine

    shutil.rmtree(args.work, ignore_errors=True)
    ckpt = make_qwen3_omni(args.work / "ckpt")
    base = {"max_batch_size": 2, "max_input_len": 128, "max_kv_cache_capacity": 256}
    comps = ["llm", "audio", "visual"]
    build(ckpt, args.work / "float", BuildArgs(**base), comps)
    build(ckpt, args.work / "int4", BuildArgs(**base, quantization="int4_rtn",
                                              quantize_encoders=True), comps)  # fmt: skip
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 3) / 16000
    clip = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)
    sf.write(args.work / "a.wav", clip.astype(np.float32), 16000)
    image = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
    Image.fromarray(image).save(args.work / "i.png")

    captured: dict[str, list[np.ndarray]] = {}
    run = runtime_engine.OrtBinding.run

    def recording(self: Any, feeds: Any, **kw: Any) -> None:
        run(self, feeds, **kw)
        names = [o.name for o in self._session.get_outputs()]
        if names and names[0] in ENCODER_OUTPUTS:
            outs = self._io.copy_outputs_to_cpu()
            captured.update({n: np.array(o) for n, o in zip(names, outs, strict=True)})

    runtime_engine.OrtBinding.run = recording  # type: ignore[method-assign]
    results = {}
    for which in ("float", "int4"):
        captured.clear()
        code = cli.main(["--config", str(args.work / which), "--prompt", "Describe.", "--audio",
                         str(args.work / "a.wav"), "--image", str(args.work / "i.png"),
                         "--max-generate-length", "4"])  # fmt: skip
        if code != cli.EXIT_OK:
            print(f"edge-infer failed on the {which} build", file=sys.stderr)
            return 1
        results[which] = dict(captured)
    for name, ref in results["float"].items():
        err = np.linalg.norm(results["int4"][name] - ref) / np.linalg.norm(ref)
        print(f"{name} {tuple(ref.shape)}: relative error {err:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
