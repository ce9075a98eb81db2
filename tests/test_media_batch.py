"""Requests prepared together share their encoder calls (runtime/media/hook.py ``expand_many``,
the text runner's ``prepare_many``): on the tiny Qwen3-VL and Qwen3-ASR builds, the prompts of
several requests prepared at once equal each one prepared alone, in fewer encoder calls, and a
request whose media cannot be read fails alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file
from edgeomni.runtime.stage import RequestError

pytest.importorskip("PIL", reason="images are read with Pillow")


def prepared(engine: Path, bodies: list[dict], encoder: str) -> tuple[list, list, int]:
    """(the prompts prepared together, each prepared alone, the encoder's calls together)."""
    pipe = Pipeline(engine)
    (stage,) = pipe.graph.stage_ids
    requests, _ = parse_request_file({"requests": bodies, "max_generate_length": 2})
    pipe.open({stage})
    runner = pipe.runner(stage)

    def states() -> list[Any]:
        return [pipe.admit(i, r) for i, r in enumerate(requests)]

    target = runner.media.encoder(encoder)
    method = "encode_many" if encoder == "audio" else "encode"
    calls = []
    original = getattr(target, method)
    setattr(target, method, lambda *a: (calls.append(1), original(*a))[1])
    together = runner.prepare_many(states())
    setattr(target, method, original)
    alone = [runner.prepare_many([s])[0] for s in states()]
    return together, alone, len(calls)


def same_prompt(a: Any, b: Any) -> None:
    np.testing.assert_array_equal(a.ids, b.ids)
    assert len(a.spans) == len(b.spans) and len(a.deepstack) == len(b.deepstack)
    for (i, x), (j, y) in zip(a.spans + a.deepstack, b.spans + b.deepstack, strict=True):
        assert i == j
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * max(1.0, float(np.abs(y).max())))
    if a.positions is None:
        assert b.positions is None
    else:
        np.testing.assert_array_equal(a.positions, b.positions)


def user(*parts: dict) -> dict:
    return {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "Hi"}]}]}


def test_images_and_videos_of_several_requests_share_a_visual_call(vl_engine: Path,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i, (h, w) in enumerate(((64, 96), (100, 80), (50, 70), (50, 70), (50, 70))):
        paths.append(str(tmp_path / f"{i}.png"))
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(paths[-1])
    bodies = [
        user({"type": "image", "image": paths[0]}),
        {"messages": [{"role": "user", "content": "text only"}]},
        user({"type": "image", "image": paths[1]}, {"type": "video", "video": paths[2:],
                                                   "fps": 2.0}),  # fmt: skip
        user({"type": "image", "image": str(tmp_path / "missing.png")}),
        user({"type": "image", "image": paths[1]}),
    ]
    together, alone, calls = prepared(vl_engine, bodies, "visual")
    assert calls == 1  # four parts of three requests in one call
    assert isinstance(together[3], RequestError) and "missing.png" in str(together[3])
    for i in (0, 1, 2, 4):
        same_prompt(together[i], alone[i])


def test_clips_of_several_requests_share_an_audio_call(asr_engine: Path, tmp_path: Path) -> None:
    import soundfile as sf

    rng = np.random.default_rng(1)
    paths = []
    for i, seconds in enumerate((1.0, 2.5, 0.3, 4.0)):
        paths.append(str(tmp_path / f"{i}.wav"))
        sf.write(paths[-1], 0.1 * rng.standard_normal(int(16000 * seconds)), 16000)
    (tmp_path / "bad.wav").write_bytes(b"RIFF not a wav")
    bodies = [user({"type": "audio", "audio": p}) for p in paths]
    bodies.insert(2, user({"type": "audio", "audio": str(tmp_path / "bad.wav")}))
    together, alone, calls = prepared(asr_engine, bodies, "audio")
    assert calls == 1
    assert isinstance(together[2], RequestError) and "bad.wav" in str(together[2])
    for i in (0, 1, 3, 4):
        same_prompt(together[i], alone[i])
