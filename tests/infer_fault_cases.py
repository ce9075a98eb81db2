"""The setups and checks of tests/test_infer_faults.py's rows: the World a row edits (a copy
of a tiny build, a request file, a clip), the Row itself, and what each row does to it. Kept
apart from the table so each file stays readable."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edgeomni.runtime.pipeline import INTERRUPTED, Pipeline

GRAPH = "multistage_config.json"
HI = {"role": "user", "content": "Hello there"}
GREEDY = '{"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 8}'


class World:
    """A scratch folder for one row: a copy of the build in eng/, a good request file r.json
    (two text requests), a 16 kHz clip q.wav; the row edits it and returns its argv."""

    def __init__(self, root: Path, engine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.monkeypatch = root, monkeypatch
        self.out = ""  # what the command printed on stdout
        self.eng = root / "eng"
        shutil.copytree(engine, self.eng)
        self.req = self.requests([{"messages": [HI]}, {"prompt": "The quick brown fox"}])
        from edgeomni.runtime.audio import write_wav

        t = np.arange(8000) / 16000
        write_wav(root / "q.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)

    def p(self, rel: str) -> str:
        return str(self.root / rel)

    def requests(self, requests: list[dict], name: str = "r.json", **top: object) -> Path:
        path = self.root / name
        path.write_text(json.dumps({"max_generate_length": 4, "requests": requests, **top}))
        return path

    def run(self, *flags: str) -> list[str]:
        """A request-file run writing p.json, greedy."""
        return ["--config", str(self.eng), "--input-file", str(self.req),
                "--output-file", self.p("p.json"), "--sampling", GREEDY, *flags]  # fmt: skip

    def prompt(self, *flags: str) -> list[str]:
        return ["--config", str(self.eng), "--prompt", "Hello", "--max-generate-length", "4",
                "--sampling", GREEDY, *flags]  # fmt: skip

    def edit(self, rel: str, change: Callable[[dict], object]) -> None:
        path = self.eng / rel
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))

    def drop(self, rel: str, dotted: str) -> None:
        *parents, key = dotted.split(".")

        def change(data: dict) -> None:
            for k in parents:
                data = data[k]
            del data[key]

        self.edit(rel, change)

    def stage(self, stage_id: str, change: Callable[[dict], object]) -> None:
        self.edit(GRAPH, lambda g: change(next(s for s in g["stages"] if s["id"] == stage_id)))


@dataclass(frozen=True)
class Row:
    id: str
    setup: Callable[[World], list[str]]
    code: int
    message: str
    engine: str = "qwen3"
    opens: bool = False  # whether any stage gets opened (loaded) before the exit
    writes: tuple[str, ...] = ()  # paths (relative to the world) the command may write
    then: Callable[[World], None] | None = None  # more checks on what it wrote
    loads: bool = False  # a broken engine dir that only loading the engine finds


def truncate(path: Path, size: int = 5) -> None:
    path.write_bytes(path.read_bytes()[:size])


def predictions(w: World) -> list[dict]:
    return predictions_of(w.root / "p.json")


def predictions_of(path: Path) -> list[dict]:
    entries = json.loads(path.read_text())["responses"]
    assert entries, path
    return entries


def one_fails(index: int, fragment: str) -> Callable[[World], None]:
    """Predictions for every request, in order; only ``index`` failed, with ``fragment``."""

    def check(w: World) -> None:
        entries = predictions(w)
        assert [e["request_idx"] for e in entries] == list(range(len(entries)))
        for e in entries:
            if e["request_idx"] == index:
                assert not e["ok"] and fragment in e["error"], e
            else:
                assert e["ok"] and e["output_text"] is not None, e

    return check


def disk_full(*args: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def a_bug(*args: object, **kwargs: object) -> None:
    raise TypeError("a bug")


def written_through_the_link(w: World) -> None:
    """The link still points at its file, which now holds the predictions."""
    assert (w.root / "l.json").is_symlink() and os.readlink(w.root / "l.json") == "t.json"
    assert len(predictions_of(w.root / "t.json")) == 2


def mixed(w: World, bad: dict) -> list[str]:
    """A request file of a good request, the bad one, and another good one."""
    w.req = w.requests([{"messages": [HI]}, bad, {"prompt": "The quick brown fox"}])
    return w.run()


def inject_engine_fault(w: World) -> list[str]:
    """The first engine call fails, as an engine raising on a cohort's rows would: the first
    request's cohort fails, the next one (a cohort of its own at --batch-size 1) still runs."""
    from edgeomni.runtime import engine

    calls = []
    real = engine.OrtBinding.run

    def run(self, *args, **kwargs):  # noqa: ANN001, ANN202
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : injected")
        return real(self, *args, **kwargs)

    w.monkeypatch.setattr(engine.OrtBinding, "run", run)
    return w.run("--batch-size", "1")


def signal_in_cohort(
    signum: int, nth: int = 2, batching: str = "cohort"
) -> Callable[[World], list[str]]:
    """A real signal to this process while the ``nth`` request decodes (batch size 1: its
    cohort, or its turn in the running batch)."""

    def setup(w: World) -> list[str]:
        from edgeomni.runtime.decoder_stage import DecoderStage

        def kill() -> None:
            os.kill(os.getpid(), signum)
            time.sleep(1)  # the handler raises here, in the main thread

        real_step = DecoderStage.step

        def step(self, slots):  # noqa: ANN001, ANN202
            real_step(self, slots)
            if any(s.state.index == nth - 1 and s.steps == 1 for s in slots.values()):
                kill()

        w.monkeypatch.setattr(DecoderStage, "step", step)
        w.req = w.requests([{"messages": [HI]}, {"prompt": "fox"}, {"prompt": "dog"}],
                           max_generate_length=8)  # fmt: skip
        return w.run("--batch-size", "1", "--batching", batching)

    return setup


def interrupted_after_first(w: World) -> None:
    entries = predictions(w)
    assert entries[0]["ok"]
    assert [e["error"] for e in entries[1:]] == [INTERRUPTED, INTERRUPTED]


def signal_while_loading(w: World) -> list[str]:
    real = Pipeline.__init__

    def init(self, *args, **kwargs):  # noqa: ANN001, ANN202
        real(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)

    w.monkeypatch.setattr(Pipeline, "__init__", init)
    return w.run()


def no_tts_special(w: World) -> None:
    from edgeomni.runtime import safetensors_np

    path = w.eng / "talker" / "projections.safetensors"
    tables = {k: np.array(v) for k, v in safetensors_np.load(path).items() if k != "tts_special"}
    safetensors_np.save(path, tables)


def raising_template(w: World) -> list[str]:
    (w.eng / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('system messages are not supported') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return mixed(w, {"messages": [{"role": "system", "content": "Be brief."}, HI]})


def audio_dir_over_input(w: World) -> list[str]:
    (w.root / "a").mkdir()
    shutil.copy(w.root / "q.wav", w.root / "a" / "audio_req0.wav")
    audio = {"type": "audio", "audio": w.p("a/audio_req0.wav")}
    w.req = w.requests([{"messages": [{"role": "user", "content": [audio]}]}])
    return w.run("--output-audio-dir", w.p("a"))


def foreign(w: World) -> World:
    """The engine dir as another tool's: no edgeomni manifest."""
    (w.eng / "edgeomni_manifest.json").unlink()
    return w


def another_engine_dir(w: World) -> list[str]:
    """--output-audio-dir naming an engine dir other than the one run (its manifest)."""
    (w.root / "other").mkdir()
    shutil.copy(w.eng / "edgeomni_manifest.json", w.root / "other")
    return w.run("--output-audio-dir", w.p("other"))


def with_external_data(w: World, keep: int | None = None) -> None:
    """llm.onnx with its weights in llm.onnx.data (the first ``keep`` bytes of it, if given)."""
    import onnx

    model = onnx.load(w.eng / "llm.onnx")
    onnx.save_model(model, w.eng / "llm.onnx", save_as_external_data=True,
                    location="llm.onnx.data", size_threshold=0)  # fmt: skip
    if keep is not None:
        truncate(w.eng / "llm.onnx.data", keep)


def truncate_data(path: Path) -> None:
    """Cut a safetensors file inside its tensors' data, keeping the header whole."""
    truncate(path, path.stat().st_size - 64)


def random_bytes(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).bytes(4096))


def escaped_echo(w: World) -> None:
    """The failed request's entry echoes its text as JSON spells it: the file is valid UTF-8
    and reads back to the same string."""
    raw = (w.root / "p.json").read_bytes()
    raw.decode("utf-8")
    assert b"\\udc80" in raw
    assert predictions(w)[1]["messages"][0]["content"][0]["text"] == "x\udc80y"


def escaped_reference(w: World) -> None:
    (w.root / "p.json").read_bytes().decode("utf-8")


def reference_kept(w: World) -> None:
    entries = predictions(w)
    assert all(e["ok"] for e in entries), entries
    assert entries[1]["reference"] == {"answer": "caf\udce9"}


def printed_predictions(w: World) -> None:
    doc = json.loads(w.out)
    assert [e["request_idx"] for e in doc["responses"]] == [0, 1]
    assert all(e["ok"] and e["output_text"] for e in doc["responses"])


def mixed_file(w: World, bad: dict, **top: object) -> list[str]:
    w.req = w.requests([{"messages": [HI]}, bad, {"prompt": "The quick brown fox"}], **top)
    return w.run()


def talker_penalty(w: World) -> list[float]:
    """Record the repetition penalty the Qwen3-TTS talker samples its first codes with."""
    from edgeomni.runtime.families.qwen3_tts.talker import TtsTalker

    seen: list[float] = []
    real = TtsTalker._sampling

    def sampling(self, request):  # noqa: ANN001, ANN202
        out = real(self, request)
        seen.append(out[0].repetition_penalty)
        return out

    w.monkeypatch.setattr(TtsTalker, "_sampling", sampling)
    w.penalties = seen  # type: ignore[attr-defined]
    return seen


def tts_file(w: World, **top: object) -> list[str]:
    talker_penalty(w)
    w.req = w.requests([{"prompt": "Hello"}], talker_max_new_tokens=4, speaker="vivian", **top)
    return ["--config", str(w.eng), "--input-file", str(w.req), "--output-file", w.p("p.json"),
            "--output-audio-dir", w.p("a"), "--sampling", '{"talker_top_k": 1}']  # fmt: skip


def penalty_is(value: float) -> Callable[[World], None]:
    def check(w: World) -> None:
        assert w.penalties == [value], w.penalties  # type: ignore[attr-defined]

    return check


def omni_talker_params(w: World, **top: object) -> list[str]:
    """An Omni request file that speaks, recording the talker's sampling of each request."""
    from edgeomni.runtime.families.qwen3_omni.talker import Talker

    seen: list[tuple] = []
    real = Talker._sampling

    def sampling(self, request):  # noqa: ANN001, ANN202
        out = real(self, request)
        seen.append(out[:2])
        return out

    w.monkeypatch.setattr(Talker, "_sampling", sampling)
    w.params = seen  # type: ignore[attr-defined]
    w.req = w.requests([{"prompt": "Hi"}], talker_max_new_tokens=3, **top)
    return ["--config", str(w.eng), "--input-file", str(w.req), "--output-file", w.p("p.json"),
            "--output-audio-dir", w.p("a"), "--sampling", '{"top_k": 1}']  # fmt: skip


def greedy_talker(w: World) -> None:
    ((talker, residual),) = w.params  # type: ignore[attr-defined]
    assert talker.greedy and residual.greedy, (talker, residual)


OMNI_SPOKE = ("p.json", "a", "a/audio_req0.wav", "a/rvq_req0.safetensors")


def voices_of_requests(w: World) -> list[str]:
    """Two requests, the second with a voice of its own, --voice for the file's default."""
    w.req = w.requests([{"messages": [HI]}, {"prompt": "fox", "voice": "ethan"}],
                       talker_max_new_tokens=3)  # fmt: skip
    return w.run("--output-audio-dir", w.p("a"), "--voice", "nobody")


def relabel_text_emit(w: World) -> list[str]:
    w.stage("llm", lambda s: s["emits"][0].update(kind="audio"))
    return w.run()


def bad_media(w: World, name: str) -> str:
    """A media file in the world that the run must refuse, by its name: junk.* (bytes that
    are no audio, image or video), nan.wav (a float WAV of NaN samples), empty.wav (no
    samples), cut.png (a PNG cut short), big.png (a 9800x9800 header: 96 Mpx, over the cap)
    and bomb.png (20000x20000: 400 Mpx, over Pillow's decompression-bomb limit too); small.png
    is a good 64x64 image."""
    import io

    import soundfile as sf
    from PIL import Image
    from test_image import png_header

    path = w.root / name
    if name.startswith("junk."):
        path.write_bytes(b"this is no media file\n" * 8)
    elif name == "nan.wav":
        sf.write(path, np.full(8000, np.nan, np.float32), 16000, subtype="FLOAT")
    elif name == "empty.wav":
        sf.write(path, np.zeros(0, np.float32), 16000, subtype="PCM_16")
    elif name in ("big.png", "bomb.png"):
        png_header(path, *((9800, 9800) if name == "big.png" else (20000, 20000)))
    else:
        buf = io.BytesIO()
        pixels = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, format="PNG")
        path.write_bytes(buf.getvalue()[: 300 if name == "cut.png" else None])
    return str(path)


def with_media(w: World, kind: str, name: str) -> list[str]:
    """A request file whose second request of three has a ``kind`` part of ``bad_media``'s
    ``name``."""
    part = {"type": kind, kind: bad_media(w, name)}
    return mixed(
        w, {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "what"}]}]}
    )
