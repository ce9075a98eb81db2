"""edge-build --graph-only: a graph for engines already on disk, and a clear reason when none.

Engines from other tools arrive without a graph and in their own layout, so these tests take the
session's tiny builds, drop their graph, rearrange them as such tools would, and check what
--graph-only finds, what it leaves out, and why it refuses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgeomni import graph_schema
from edgeomni.builder import cli
from edgeomni.builder.build import GRAPH_FILE, graph_only, unrun_components, write_graph
from edgeomni.builder.discover import discover, tensor_parallel_markers
from edgeomni.export.common.checkpoint import open_checkpoint
from edgeomni.export.family import Component

SPEECH = ("talker", "code_predictor", "code2wav", "code2wav_stream")


def copy_engines(src: Path, dst: Path) -> Path:
    """The engines of a build, without the graph the build wrote."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(GRAPH_FILE))
    return dst


def move_root_into(eng: Path, place: str) -> None:
    """Move the backbone's files (every plain file at the root) into eng/place."""
    (eng / place).mkdir(parents=True)
    for f in [p for p in eng.iterdir() if p.is_file()]:
        f.rename(eng / place / f.name)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["--graph-only", *argv])
    return code, capsys.readouterr().err


def graph_json(eng: Path) -> dict:
    return json.loads((eng / GRAPH_FILE).read_text())


# ---- discovery rules, on empty files (no checkpoint needed)


def touch(eng: Path, *rels: str) -> None:
    for rel in rels:
        (eng / rel).parent.mkdir(parents=True, exist_ok=True)
        (eng / rel).write_text("{}")


LLM = Component("llm", ".", "llm.onnx", "llm.backbone")
AUDIO = Component("audio", "audio", "audio.onnx", "encoder.audio")
VISUAL = Component("visual", "visual", "visual.onnx", "encoder.visual")
VOCODER = Component("code2wav", "vocoder", "code2wav.onnx", "qwen3_omni.code2wav")


def test_discovery_places(tmp_path: Path, logs) -> None:
    touch(
        tmp_path,
        "llm/llm.onnx", "llm/config.json",  # backbone in llm/
        "audio/audio.onnx", "audio/config.json",  # encoder at the top
        "multimodal/visual/visual.onnx", "multimodal/visual/config.json",  # under multimodal/
        "vocoder/code2wav.onnx", "vocoder/config.json",  # the family's own subdir
    )  # fmt: skip
    disc = discover(tmp_path, [LLM, AUDIO, VISUAL, VOCODER])
    assert dict(disc.found) == {
        "llm": "llm",
        "audio": "audio",
        "visual": "multimodal/visual",
        "code2wav": "vocoder",
    }
    assert disc.left_out == () and not disc.missing


def test_discovery_first_match_wins_and_needs_a_config(tmp_path: Path, logs) -> None:
    touch(
        tmp_path,
        "llm.onnx", "config.json", "thinker/llm.onnx", "thinker/config.json",
        "audio/audio.onnx",  # no config.json beside it
    )  # fmt: skip
    disc = discover(tmp_path, [LLM, AUDIO])
    assert dict(disc.found) == {"llm": "."}
    assert disc.missing == {"audio": ("audio", "multimodal/audio")}
    assert set(disc.left_out) == {"thinker/llm.onnx", "audio/audio.onnx"}
    assert "thinker/llm.onnx left out of the graph: llm was already found in ." in logs.text
    assert "audio/audio.onnx left out of the graph: audio is looked for as audio.onnx" in logs.text


def test_scan_goes_two_levels_deep(tmp_path: Path, logs) -> None:
    touch(tmp_path, "a/b/two.engine", "a/b/c/three.onnx")
    disc = discover(tmp_path, [LLM])
    assert disc.left_out == ("a/b/two.engine",)
    assert "not a place --graph-only looks" in disc.notes[0]


def test_tensor_parallel_markers(tmp_path: Path) -> None:
    assert tensor_parallel_markers(tmp_path) == []
    touch(tmp_path, "config_world2.json", "talker/llm_rank1.onnx", "llm_ranking.txt")
    assert tensor_parallel_markers(tmp_path) == ["config_world2.json", "talker/llm_rank1.onnx"]


# ---- qwen3: one backbone, wherever the rules allow it


@pytest.mark.parametrize("place", [".", "thinker", "llm"])
def test_qwen3_backbone_places(qwen3_engine: Path, qwen3_ckpt: Path, tmp_path: Path, place: str):
    eng = copy_engines(qwen3_engine, tmp_path / "eng")
    if place != ".":
        move_root_into(eng, place)
    path = graph_only(qwen3_ckpt, eng)
    assert path == eng.resolve() / GRAPH_FILE
    got, built = graph_json(eng), graph_json(qwen3_engine)
    assert got["stages"][0]["artifact"] == place
    got["stages"][0]["artifact"] = "."
    assert got == built  # same stage, same limits (stamped from the moved config.json)
    from edgeomni.runtime import cli as infer

    assert infer.main(["--config", str(eng), "--validate-config"]) == infer.EXIT_OK


def test_qwen3_backbone_elsewhere_is_no_graph(
    qwen3_engine: Path, qwen3_ckpt: Path, tmp_path: Path, capsys, logs
) -> None:
    eng = copy_engines(qwen3_engine, tmp_path / "eng")
    move_root_into(eng, "models/backbone")
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert "without its llm component" in err and "., thinker/, llm/" in err
    assert "left out: models/backbone/llm.onnx" in err
    assert "models/backbone/llm.onnx left out of the graph" in logs.text
    assert not (eng / GRAPH_FILE).exists()


def test_unrelated_engine_is_left_out(
    qwen3_engine: Path, qwen3_ckpt: Path, tmp_path: Path, capsys, logs
) -> None:
    eng = copy_engines(qwen3_engine, tmp_path / "eng")
    touch(eng, "extras/projector.onnx", "tools/old/draft.engine")
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_OK and f"wrote {eng.resolve() / GRAPH_FILE}" in err
    assert "extras/projector.onnx left out of the graph" in logs.text
    assert "tools/old/draft.engine left out of the graph" in logs.text
    assert [s["artifact"] for s in graph_json(eng)["stages"]] == ["."]


@pytest.mark.parametrize("marker", ["config_world2.json", "llm_rank0.onnx"])
def test_tensor_parallel_build_is_no_graph(
    qwen3_engine: Path, qwen3_ckpt: Path, tmp_path: Path, capsys, logs, marker: str
) -> None:
    eng = copy_engines(qwen3_engine, tmp_path / "eng")
    touch(eng, marker)
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert "tensor-parallel" in err and marker in err
    assert not (eng / GRAPH_FILE).exists()
    assert graph_only(qwen3_ckpt, eng) is None  # the library call logs the same reason
    assert f"no {GRAPH_FILE} written" in logs.text and "tensor-parallel" in logs.text


def test_engines_of_another_model_type(
    omni_engine: Path, qwen3_ckpt: Path, tmp_path: Path, capsys
) -> None:
    eng = copy_engines(omni_engine, tmp_path / "eng")
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert "built from a qwen3_omni_moe checkpoint, but --model-dir is qwen3" in err


def test_missing_engine_dir(qwen3_ckpt: Path, tmp_path: Path, capsys) -> None:
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir", str(tmp_path / "x"))
    assert code == cli.EXIT_BAD_INPUT and "is not a directory" in err


# ---- qwen3_omni: the speech stages


def test_omni_graph_equals_the_full_build(
    omni_engine: Path, omni_ckpt: Path, tmp_path: Path, capsys
) -> None:
    eng = copy_engines(omni_engine, tmp_path / "eng")
    code, err = run_cli(capsys, "--model-dir", str(omni_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_OK, err
    assert graph_json(eng) == graph_json(omni_engine)
    assert (eng / GRAPH_FILE).read_text() == (omni_engine / GRAPH_FILE).read_text()


def test_omni_talker_elsewhere_leaves_its_partners_unrun(
    omni_engine: Path, omni_ckpt: Path, tmp_path: Path, capsys, logs
) -> None:
    """Without the talker the family's graph is thinker-only, so the code predictor and code2wav
    found in their places would sit unused: no graph, and the reason names the talker."""
    eng = copy_engines(omni_engine, tmp_path / "eng")
    (eng / "speech").mkdir()
    (eng / "talker").rename(eng / "speech" / "talker")
    code, err = run_cli(capsys, "--model-dir", str(omni_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert "speech/talker/llm.onnx left out of the graph: talker is looked for in talker/" in (
        logs.text
    )
    assert "no stage runs code_predictor (in code_predictor/), code2wav (in code2wav/)" in err
    assert "only stages thinker" in err
    assert "not found: talker (looked in talker/)" in err
    assert "left out: speech/talker/llm.onnx" in err
    assert not (eng / GRAPH_FILE).exists()


def test_omni_speech_elsewhere_gives_a_thinker_only_graph(
    omni_engine: Path, omni_ckpt: Path, tmp_path: Path, logs
) -> None:
    eng = copy_engines(omni_engine, tmp_path / "eng")
    (eng / "speech").mkdir()
    for name in SPEECH:
        (eng / name).rename(eng / "speech" / name)
    assert graph_only(omni_ckpt, eng) is not None
    graph = graph_json(eng)
    assert [s["id"] for s in graph["stages"]] == ["thinker"]
    assert graph["terminals"] == ["thinker:text"]
    assert graph["stages"][0] == graph_json(omni_engine)["stages"][0]
    for rel in ("speech/talker/llm.onnx", "speech/code_predictor/llm.onnx",
                "speech/code2wav/code2wav.onnx"):  # fmt: skip
        assert f"{rel} left out of the graph" in logs.text
    assert "no talker engine, left out of the graph" in logs.text


def test_omni_talker_that_no_stage_runs(
    omni_engine: Path, omni_ckpt: Path, tmp_path: Path, capsys
) -> None:
    """Without code2wav the graph comes back thinker-only; the talker found in talker/ would
    never run, so no graph."""
    eng = copy_engines(omni_engine, tmp_path / "eng")
    shutil.rmtree(eng / "code2wav")
    code, err = run_cli(capsys, "--model-dir", str(omni_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert "no stage runs talker (in talker/), code_predictor (in code_predictor/)" in err
    assert "not found: code2wav (looked in code2wav/)" in err
    assert not (eng / GRAPH_FILE).exists()


def test_omni_without_llm_is_no_graph(
    omni_engine: Path, omni_ckpt: Path, tmp_path: Path, capsys, logs
) -> None:
    eng = copy_engines(omni_engine, tmp_path / "eng")
    (eng / "llm.onnx").unlink()
    code, err = run_cli(capsys, "--model-dir", str(omni_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert "a qwen3_omni_moe build without its llm component cannot run as a graph" in err
    assert not (eng / GRAPH_FILE).exists()
    assert graph_only(omni_ckpt, eng) is None
    assert "without its llm component" in logs.text


def test_no_graph_keeps_the_old_one_and_says_so(
    omni_engine: Path, omni_ckpt: Path, tmp_path: Path, capsys
) -> None:
    eng = tmp_path / "eng"
    shutil.copytree(omni_engine, eng)
    (eng / "llm.onnx").unlink()
    code, err = run_cli(capsys, "--model-dir", str(omni_ckpt), "--engine-dir", str(eng))
    assert code == cli.EXIT_BAD_INPUT
    assert f"the {GRAPH_FILE} already there was left as it was" in err
    assert graph_json(eng) == graph_json(omni_engine)


# ---- the optional family hooks, and write_graph's reason


def test_served_by_overrides_the_runner_default(omni_engine: Path, omni_ckpt: Path) -> None:
    from edgeomni.export.families.qwen3_omni import build as qwen3_omni

    graph = graph_schema.load(omni_engine / GRAPH_FILE)
    ckpt = open_checkpoint(omni_ckpt)
    available = qwen3_omni.components(ckpt)
    found = {c.name: c.subdir for c in available}
    # default: the code predictor shares the talker's runner, so the talker stage runs it
    assert unrun_components(qwen3_omni, graph, found, available) == []
    hooks = SimpleNamespace(served_by={"code_predictor": "somewhere_else"})
    assert unrun_components(hooks, graph, found, available) == ["code_predictor"]
    hooks = SimpleNamespace(served_by={"code_predictor": "talker"})
    assert unrun_components(hooks, graph, found, available) == []


def test_write_graph_says_why_not(omni_ckpt: Path, tmp_path: Path, logs) -> None:
    from edgeomni.export.families.qwen3_omni import build as qwen3_omni
    from edgeomni.export.families.qwen3_omni.build import TALKER

    ckpt = open_checkpoint(omni_ckpt)
    assert write_graph(qwen3_omni, ckpt, tmp_path, [TALKER], None) is None
    assert "cannot run components talker as a graph without llm" in logs.text
    own = SimpleNamespace(
        components=qwen3_omni.components,
        multistage_topology=lambda *a: None,
        no_graph_reason=lambda comps: f"family says no to {', '.join(comps)}",
    )
    assert write_graph(own, ckpt, tmp_path, [TALKER], None) is None
    assert "family says no to talker" in logs.text
    assert not (tmp_path / GRAPH_FILE).exists()


# ---- the command line


def test_help_mentions_graph_only(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--graph-only" in out and "size, backend and components flags are not needed" in out
    assert "thinker" in out and "multimodal" in out


def test_size_flags_are_ignored_with_a_warning(
    qwen3_engine: Path, qwen3_ckpt: Path, tmp_path: Path, capsys, logs
) -> None:
    eng = copy_engines(qwen3_engine, tmp_path / "eng")
    argv = ("--model-dir", str(qwen3_ckpt), "--engine-dir", str(eng), "--max-batch-size", "9")
    code, _ = run_cli(capsys, *argv)
    assert code == cli.EXIT_OK
    assert "--max-batch-size ignored with --graph-only" in logs.text
    assert graph_json(eng)["stages"][0]["max_batch"] == 3  # from the engine, not the flag
