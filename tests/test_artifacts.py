"""Each runner's declared Artifact is what opening its folder needs: every declared key is
checked (removing one is an ArtifactError naming it), and the declared keys are enough (a
config.json cut down to them still opens), so --validate-config and a run agree."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgeomni.runtime.artifacts import Artifact, ArtifactError, check_folder
from edgeomni.runtime.families.qwen3_omni import talker
from edgeomni.runtime.media import audio_encoder as audio
from edgeomni.runtime.media import visual_encoder as visual
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.runners import llm
from edgeomni.runtime.speech import code2wav
from edgeomni.runtime.speech.code_predictor import cp_artifact
from edgeomni.runtime.tokenizer import TextTokenizer

# (fixture, folder, its artifact); the code predictor's tables follow the talker's 16 groups
FOLDERS = [
    ("qwen3_engine", ".", llm.ARTIFACT),
    ("omni_engine", ".", llm.ARTIFACT),
    ("omni_engine", "talker", talker.ARTIFACT),
    ("omni_engine", "code_predictor", cp_artifact(16)),
    ("omni_engine", "code2wav", code2wav.ARTIFACT),
    ("omni_engine", "code2wav_stream", code2wav.STREAM_ARTIFACT),
    ("omni_engine", "audio", audio.ARTIFACT),
    ("omni_engine", "visual", visual.ARTIFACT),
]
IDS = [f"{f.split('_')[0]}:{d}" for f, d, _ in FOLDERS]


def cut_down(config: dict, keys: tuple[str, ...]) -> dict:
    """Only ``keys`` (dotted) of ``config``, plus what every stage config names (the engine)."""
    out: dict = {k: config[k] for k in ("engine", "backend", "component") if k in config}
    for dotted in keys:
        *parents, last = dotted.split(".")
        src, dst = config, out
        for k in parents:
            src, dst = src[k], dst.setdefault(k, {})
        dst[last] = src[last]
    return out


def declared_keys(artifact: Artifact) -> tuple[str, ...]:
    return ("engine", "backend", *artifact.keys)


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize(("fixture", "folder", "artifact"), FOLDERS, ids=IDS)
def test_every_declared_key_is_checked(fixture, folder, artifact, request, tmp_path) -> None:
    eng = tmp_path / "eng"
    shutil.copytree(request.getfixturevalue(fixture), eng)
    path = eng / folder / "config.json"
    full = json.loads(path.read_text())
    for dotted in declared_keys(artifact):
        path.write_text(json.dumps(drop(full, dotted)))
        with pytest.raises(ArtifactError, match=f"missing '{dotted}'"):
            check_folder(eng / folder, artifact)
    path.write_text(json.dumps(full))
    check_folder(eng / folder, artifact)


def drop(config: dict, dotted: str) -> dict:
    out = json.loads(json.dumps(config))
    *parents, last = dotted.split(".")
    node = out
    for k in parents:
        node = node[k]
    del node[last]
    return out


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize(("fixture", "folder", "artifact"), FOLDERS, ids=IDS)
def test_declared_keys_are_enough(fixture, folder, artifact, request, tmp_path) -> None:
    """A config.json with only the declared keys opens: the runner (or encoder) reads no other
    key it cannot do without."""
    eng = tmp_path / "eng"
    shutil.copytree(request.getfixturevalue(fixture), eng)
    path = eng / folder / "config.json"
    path.write_text(json.dumps(cut_down(json.loads(path.read_text()), artifact.keys)))
    if folder == "audio":
        audio.AudioEncoder(eng / folder)
    elif folder == "visual":
        visual.VisualEncoder(eng / folder)
    else:
        pipeline = Pipeline(eng)
        pipeline.check()
        pipeline.open([s.id for s in pipeline.graph.stages])


def test_a_table_must_hold_its_tensors(qwen3_engine: Path, tmp_path: Path) -> None:
    from edgeomni.runtime import safetensors_np

    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    table = eng / "embedding.safetensors"
    safetensors_np.save(table, {"other": safetensors_np.load(table)["embedding"][:2].copy()})
    with pytest.raises(ArtifactError, match="has no tensor embedding"):
        check_folder(eng, llm.ARTIFACT)


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"", "too short"), (b"\x10\x00\x00\x00\x00\x00\x00\x00{", "file ends after 1"),
     (b"\x02\x00\x00\x00\x00\x00\x00\x00[]", "not a JSON object")],
)  # fmt: skip
def test_safetensors_header_errors(tmp_path: Path, data: bytes, message: str) -> None:
    from edgeomni.runtime import safetensors_np

    (tmp_path / "t.safetensors").write_bytes(data)
    with pytest.raises(ValueError, match=message):
        safetensors_np.header(tmp_path / "t.safetensors")


def test_a_template_that_cannot_render_the_messages_is_a_value_error(
    qwen3_engine: Path, tmp_path: Path
) -> None:
    """A template that concatenates content as text, given a part list: the request's error
    says so (the run goes on), not a TypeError out of jinja."""
    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    (eng / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ 'x' + m.content }}{% endfor %}"
    )
    tok = TextTokenizer(eng)
    parts = [{"type": "text", "text": "a"}]
    with pytest.raises(ValueError, match="cannot render these messages .TypeError"):
        tok.apply_chat_template([{"role": "user", "content": parts}])
    assert tok.apply_chat_template([{"role": "user", "content": "a"}]) == "xa"


def stage(**config) -> SimpleNamespace:
    """What LLMBackbone.check reads of a graph's stage: its config."""
    return SimpleNamespace(config=config)


def thinker_files(engine: Path, dest: Path) -> Path:
    """The files of the engine dir's root stage (the text model), without its subfolders."""
    dest.mkdir()
    for path in engine.iterdir():
        if path.is_file():
            shutil.copy2(path, dest / path.name)
    return dest


def test_media_tokens_for_a_model_type_with_no_media_hook(omni_engine, tmp_path) -> None:
    """A thinker config with media_tokens whose model_type no family declares media
    preparation for: an ArtifactError naming the config, not a silent text-only model."""
    eng = thinker_files(omni_engine, tmp_path / "eng")
    path = eng / "config.json"
    config = json.loads(path.read_text())
    assert config["model_type"] == "qwen3_omni_moe" and config["media_tokens"]
    llm.LLMBackbone.check(stage(), eng)  # its own model type: the family's hook
    path.write_text(json.dumps({**config, "model_type": "omni9"}))
    with pytest.raises(ArtifactError, match="media_tokens, but its model_type 'omni9'") as e:
        llm.LLMBackbone.check(stage(), eng)
    assert e.value.path == str(path)
    path.write_text(json.dumps({**config, "media_tokens": {"audio_token_id": 1}}))
    with pytest.raises(ArtifactError, match="missing 'media_tokens.image_token_id'"):
        llm.LLMBackbone.check(stage(), eng)


def test_encoders_named_for_a_text_model(qwen3_engine: Path) -> None:
    """A stage config naming encoders for a model type that reads text only is an ArtifactError
    naming the thinker's config."""
    llm.LLMBackbone.check(stage(), qwen3_engine)
    with pytest.raises(
        ArtifactError, match=r"names encoders \(audio\), but model_type 'qwen3'"
    ) as e:
        llm.LLMBackbone.check(stage(encoders={"audio": "audio"}), qwen3_engine)
    assert e.value.path == str(qwen3_engine / "config.json")
