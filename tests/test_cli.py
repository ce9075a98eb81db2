"""edge-infer's command line: --validate-config, --help, exit codes, sampling."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgeomni.runtime import cli


def test_help_lists_the_flags(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--prompt", "--input-file", "--output-file", "--batch-size", "--sampling",
                 "--validate-config", "--dump-profile", "exit status"):  # fmt: skip
        assert flag in out


def test_validate_config_accepts_a_build(qwen3_engine: Path, capsys) -> None:
    assert cli.main(["--config", str(qwen3_engine), "--validate-config"]) == cli.EXIT_OK
    assert "valid (1 stages, terminals llm:text)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda g: g["stages"][0].update(runner="llm.backbonez"), "$.stages[0].runner"),
        (lambda g: g["stages"][0].update(kind="iterative"), "$.stages[0].kind"),
        (lambda g: g["stages"][0].update(artifact="../elsewhere"), "$.stages[0].artifact"),
        (lambda g: g.update(terminals=["llm:texts"]), "$.terminals"),
    ],
)
def test_validate_config_names_the_fault(
    qwen3_engine: Path, tmp_path: Path, capsys, edit, message
) -> None:
    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    graph = json.loads((eng / "multistage_config.json").read_text())
    edit(graph)
    (eng / "multistage_config.json").write_text(json.dumps(graph))
    assert cli.main(["--config", str(eng), "--validate-config"]) == cli.EXIT_BAD_CONFIG
    assert message in capsys.readouterr().err


def test_missing_graph_is_a_config_error(tmp_path: Path, capsys) -> None:
    assert cli.main(["--config", str(tmp_path), "--validate-config"]) == cli.EXIT_BAD_CONFIG
    assert "multistage_config.json" in capsys.readouterr().err


def test_needs_a_request(qwen3_engine: Path, capsys) -> None:
    assert cli.main(["--config", str(qwen3_engine)]) == cli.EXIT_BAD_CONFIG
    assert "--prompt" in capsys.readouterr().err


@pytest.mark.parametrize("sampling", ['{"temprature": 1}', '{"top_p": 0}', "not json"])
def test_bad_sampling_is_refused(qwen3_engine: Path, capsys, sampling: str) -> None:
    code = cli.main(["--config", str(qwen3_engine), "--prompt", "hi", "--sampling", sampling])
    assert code == cli.EXIT_BAD_CONFIG
    assert "--sampling" in capsys.readouterr().err


def test_malformed_request_file(qwen3_engine: Path, tmp_path: Path, capsys) -> None:
    req = tmp_path / "r.json"
    req.write_text('{"requests": 5}')
    assert (
        cli.main(["--config", str(qwen3_engine), "--input-file", str(req)]) == cli.EXIT_BAD_CONFIG
    )
    assert "requests" in capsys.readouterr().err


def test_seeded_sampling_is_reproducible(qwen3_engine: Path, tmp_path: Path) -> None:
    body = {
        "temperature": 1.5,
        "top_k": 0,
        "top_p": 1.0,
        "max_generate_length": 16,
        "requests": [{"messages": [{"role": "user", "content": "Hello"}]}],
    }
    runs = []
    for seed in (7, 7, 8):
        req, pred = tmp_path / "r.json", tmp_path / f"p{seed}-{len(runs)}.json"
        req.write_text(json.dumps({**body, "sampling_seed": seed}))
        code = cli.main(
            ["--config", str(qwen3_engine), "--input-file", str(req), "--output-file", str(pred)]
        )
        assert code == cli.EXIT_OK
        runs.append(json.loads(pred.read_text())["responses"][0]["stages"]["llm"]["output_tokens"])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_dump_profile(qwen3_engine: Path, capsys) -> None:
    code = cli.main(
        ["--config", str(qwen3_engine), "--prompt", "Hello", "--max-generate-length", "4",
         "--sampling", '{"top_k": 1}', "--dump-profile"]
    )  # fmt: skip
    assert code == cli.EXIT_OK
    err = capsys.readouterr().err
    profile = json.loads(err[err.index("{") :])
    assert profile["stages"]["llm"]["requests"] == 1
    assert profile["peak_rss_mb"] > 0 and profile["wall_ms"] > 0


def test_missing_engine_file_is_a_config_error(qwen3_engine: Path, tmp_path: Path, capsys) -> None:
    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    (eng / "llm.onnx").unlink()
    code = cli.main(["--config", str(eng), "--prompt", "hi", "--max-generate-length", "2"])
    assert code == cli.EXIT_BAD_CONFIG
    assert "llm.onnx is missing" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--input-file", "x.json", "--audio", "a.wav"], "--audio, --image and --video go with --prompt"),
        (["--input-file", "x.json", "--out-audio", "a.wav"], "--out-audio goes with --prompt"),
        (
            ["--prompt", "hi", "--output-audio-dir", "d"],
            "--output-audio-dir goes with --input-file",
        ),
    ],
)
def test_flag_combinations(qwen3_engine: Path, capsys, flags, message) -> None:
    assert cli.main(["--config", str(qwen3_engine), *flags]) == cli.EXIT_BAD_CONFIG
    assert message in capsys.readouterr().err


def test_audio_on_a_text_only_graph(qwen3_engine: Path, tmp_path: Path, capsys) -> None:
    code = cli.main(
        ["--config", str(qwen3_engine), "--prompt", "hi", "--out-audio", str(tmp_path / "a.wav")]
    )
    assert code == cli.EXIT_BAD_CONFIG
    assert "no audio output" in capsys.readouterr().err


def test_the_batch_size_default_of_1_is_said_in_help_and_readme(
    qwen3_engine: Path, tmp_path: Path, monkeypatch
) -> None:
    """Neither --batch-size nor the file's batch_size: requests run one at a time, whatever
    the build allows; --help and the README's edge-infer section say so."""
    import re

    from edgeomni.runtime.pipeline import Pipeline

    seen: list[int] = []

    def run(self, requests, *, batch_size, **kwargs):
        seen.append(batch_size)
        raise RuntimeError("stop here")

    monkeypatch.setattr(Pipeline, "run", run)
    req = tmp_path / "r.json"
    req.write_text(json.dumps({"requests": [{"prompt": "a"}, {"prompt": "b"}]}))
    assert cli.main(["--config", str(qwen3_engine), "--input-file", str(req)]) == cli.EXIT_INTERNAL
    assert seen == [1]
    action = next(a for a in cli.parser()._actions if a.dest == "batch_size")
    assert "batch_size, else 1" in action.help
    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text[text.index("`edge-infer --config") : text.index("`edge-serve --config")]
    assert re.search(r"`--batch-size` defaults to the request file's `batch_size`, else 1", section)


def test_the_readme_one_liners_make_the_media_they_name(tmp_path: Path) -> None:
    """Each README one-liner that hands edge-infer an --image or --audio file makes it first,
    with what the setup installs: its ``python -c`` steps run here (in a scratch folder for
    /tmp/edgeomni-demo), and the file they write is one edge-infer reads."""
    import shlex
    import subprocess
    import sys

    from edgeomni.runtime.audio import read_wav
    from edgeomni.runtime.media.image import load_image

    text = (Path(__file__).parents[1] / "README.md").read_text()
    lines = [x for x in text.splitlines() if "edge-infer " in x and ("--image " in x or "--audio " in x)]
    assert len(lines) >= 2
    for line in lines:
        line = line.replace("/tmp/edgeomni-demo", str(tmp_path))
        *before, infer = [shlex.split(step) for step in line.split(" && ")]
        for argv in before:
            if argv[:2] == [".venv/bin/python", "-c"]:
                subprocess.run([sys.executable, *argv[1:]], check=True, timeout=120)
        for flag, read in (("--image", load_image), ("--audio", read_wav)):
            for i in [i for i, a in enumerate(infer) if a == flag]:
                assert Path(infer[i + 1]).is_file(), f"{line[:60]}...: {infer[i + 1]} is not made"
                read(infer[i + 1])  # a file edge-infer reads
