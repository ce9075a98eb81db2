"""edge-serve on a Qwen3-VL graph: image chat (image_url data URLs) through OpenAI's own client,
plain and streamed, equals edge-infer's reply for the same image file; media the graph does not
read, and path parts, are 400."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

sys.path.insert(0, str(Path(__file__).parent))
from test_serve import MODEL, client, start  # noqa: E402

from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.requests import parse_request_file  # noqa: E402


def test_image_chat_equals_edge_infer(vl_engine: Path, tmp_path: Path) -> None:
    from PIL import Image

    image = (np.random.default_rng(5).random((70, 100, 3)) * 255).astype(np.uint8)
    Image.fromarray(image).save(tmp_path / "i.png")
    content = [{"type": "image", "image": str(tmp_path / "i.png")},
               {"type": "text", "text": "What is this?"}]  # fmt: skip
    requests, _ = parse_request_file({"top_k": 1, "requests": [
        {"messages": [{"role": "user", "content": content}], "max_generate_length": 8}]})  # fmt: skip
    (want,) = Pipeline(vl_engine).run(requests, batch_size=1)
    assert want.entry["ok"], want.entry["error"]
    png = base64.b64encode((tmp_path / "i.png").read_bytes()).decode()
    s = start(vl_engine, batch_size=2, max_queue=2)
    try:
        content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                   {"type": "text", "text": "What is this?"}]  # fmt: skip
        messages = [{"role": "user", "content": content}]
        api = client(s)
        got = api.chat.completions.create(model=MODEL, max_tokens=8, extra_body={"top_k": 1},
                                          messages=messages)  # fmt: skip
        assert got.choices[0].message.content == want.entry["output_text"]
        stream = api.chat.completions.create(model=MODEL, max_tokens=8, stream=True,
                                             extra_body={"top_k": 1}, messages=messages)  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == want.entry["output_text"]
        import soundfile as sf

        sf.write(tmp_path / "a.wav", np.zeros(1600), 16000, subtype="PCM_16")
        wav = base64.b64encode((tmp_path / "a.wav").read_bytes()).decode()
        for part, param, says in (
            ({"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
             None, "this model reads no audio"),
            ({"type": "video", "video": str(tmp_path / "i.png")}, "messages[0].content[0].type",
             "takes a path"),
        ):  # fmt: skip
            r = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": [part]}]})  # fmt: skip
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == param and says in r.text, r.text
    finally:
        s.stop()
