"""A family is its folders: a family defined entirely under tests/ (tests/toy_family/) registers
through the public API, as an out-of-tree family does (``EDGEOMNI_FAMILIES``), and builds and runs
end to end with no generic file naming it; every registered family's tiny checkpoint builds
through edge-build and answers through edge-infer; and the generic runtime, serve and builder
files name no family's request key or stage-key prefix."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p),
    "EDGEOMNI_FAMILIES": "toy_family",
}


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=900)


def tool(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else name


def registered() -> list[list]:
    """(name, model_type, smoke flags) of every registered family with a tiny maker, the toy's
    included: read in a fresh interpreter, the way edge-build reads the registry."""
    code = ("import json; from edgeomni.export.registry import families; "
            "print(json.dumps([[f.name, f.model_types[0], list(f.smoke)] "
            "for f in families() if f.tiny]))")  # fmt: skip
    out = run(sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


FAMILIES = registered()


def build(model_type: str, root: Path) -> Path:
    ckpt, engine = root / "ckpt", root / "engine"
    made = run(sys.executable, "-m", "edgeomni.export.tiny", model_type, str(ckpt))
    assert made.returncode == 0, made.stderr
    built = run(tool("edge-build"), "--model-dir", str(ckpt), "--engine-dir", str(engine),
                "--max-batch-size", "2", "--max-input-len", "128",
                "--max-kv-cache-capacity", "256")  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert (engine / "multistage_config.json").is_file()
    return engine


@pytest.fixture(scope="module")
def toy_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy's tiny checkpoint (python -m edgeomni.export.tiny), built by edge-build."""
    return build("edgeomni_toy", tmp_path_factory.mktemp("toy"))


def test_the_walk_finds_the_built_in_families_and_the_toy() -> None:
    names = {name for name, _, _ in FAMILIES}
    assert {"qwen3", "qwen3_omni", "qwen3_tts", "qwen3_asr", "edgeomni_toy"} <= names


# the session's engines (tests/conftest.py) built from the same tiny checkpoints, by
# builder.build (what edge-build runs): reused so the suite builds each once. A family not
# here, or every family with EDGEOMNI_FULL_WALK=1, is built through edge-build here (the toy's
# engine is: through python -m edgeomni.export.tiny and edge-build).
SESSION_ENGINES = {"qwen3": "qwen3_engine", "qwen3_omni_moe": "omni_engine",
                   "qwen3_tts": "tts_engine", "qwen3_asr": "asr_engine", "qwen3_vl": "vl_engine",
                   "edgeomni_toy": "toy_engine"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name,model_type,smoke", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_every_family_builds_and_answers(name: str, model_type: str, smoke: list[str],
                                         tmp_path: Path, request) -> None:  # fmt: skip
    """Each registered family's tiny checkpoint (its declared maker), built, answers a prompt
    through edge-infer with the flags the family declares for a smoke run."""
    fixture = SESSION_ENGINES.get(model_type)
    if fixture is None or os.environ.get("EDGEOMNI_FULL_WALK") == "1":
        engine = build(model_type, tmp_path)
    else:
        engine = request.getfixturevalue(fixture)
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in smoke]
    out = run(tool("edge-infer"), "--config", str(engine), "--prompt", "Hello", *flags)
    assert out.returncode == 0, out.stderr[-3000:]
    graph = json.loads((engine / "multistage_config.json").read_text())
    wavs = [Path(f) for f in flags if f.endswith(".wav")]
    if wavs:
        import soundfile as sf

        assert sf.info(str(wavs[0])).frames > 0
    if any(t.endswith(":text") for t in graph["terminals"]) and not wavs:
        assert out.stdout.strip(), "no reply"


def test_toy_family_end_to_end(toy_engine: Path, tmp_path: Path) -> None:
    """Built by edge-build from its tiny checkpoint, run by edge-infer: its ONNX engine shifts
    the text, its request control (a flag, a request key) is validated as it declares, and its
    stage key is accepted and a typo of it named."""
    engine = toy_engine
    out = run(tool("edge-infer"), "--config", str(engine), "--prompt", "HAL")
    assert (out.returncode, out.stdout.strip()) == (0, "IBM"), out.stderr
    out = run(tool("edge-infer"), "--config", str(engine), "--prompt", "HAL", "--rot", "1",
              "--batching", "cohort")  # fmt: skip
    assert (out.returncode, out.stdout.strip()) == (0, "JCN"), out.stderr
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps({"rot": 2, "requests": [
        {"prompt": "abc"}, {"prompt": "abc", "rot": 0, "sampling": {"shift_seed": 3}},
        {"prompt": "x", "rot": 30}, {"prompt": "x", "sampling": {"shift_sed": 1}},
    ]}))  # fmt: skip
    answers = tmp_path / "out.json"
    out = run(tool("edge-infer"), "--config", str(engine), "--input-file", str(requests),
              "--output-file", str(answers))  # fmt: skip
    assert out.returncode != 0  # two requests fail alone
    got = [(r["ok"], r["output_text"]) for r in json.loads(answers.read_text())["responses"]]
    assert got[:2] == [(True, "def"), (True, "bcd")]
    assert got[2] == (False, "rot must be an integer in 0..25, got 30")
    assert not got[3][0] and "'shift_sed' -> 'shift_seed'" in got[3][1]
    # no file outside tests/ knows the toy
    for top in ("graph_schema", "export", "plugins", "builder", "runtime"):
        for path in (ROOT / top).rglob("*.py"):
            assert "edgeomni_toy" not in path.read_text(), path


def test_unknown_runner_without_the_plugin(toy_engine: Path) -> None:
    """The same engine dir without the toy registered is an invalid graph naming its runner."""
    engine = toy_engine
    env = {k: v for k, v in ENV.items() if k != "EDGEOMNI_FAMILIES"}
    out = subprocess.run([tool("edge-infer"), "--config", str(engine), "--prompt", "HAL"],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 2 and "unknown runner 'edgeomni_toy.shift'" in out.stderr


def family_literals() -> set[str]:
    """Every built-in family's request keys, stage-key prefixes and aliases."""
    from edgeomni.runtime import families

    keys = set(families.REQUEST_KEYS) | set(families.ALIASES) | set(families.STAGE_KEYS)
    return keys | set(families.STAGE_PREFIXES) | set(families.TEXT_FALLBACKS.values())


def test_generic_files_name_no_family_key() -> None:
    """runtime/requests.py, cli.py, pipeline.py, serve/ and the builder read the families'
    keys from their declarations: no string literal of theirs is one (or starts with a
    family's stage-key prefix)."""
    import ast

    from edgeomni.runtime import families
    from edgeomni.runtime.serve.transcribe import FIELDS as TRANSCRIPTION_FIELDS

    literals = family_literals()
    files = [ROOT / "runtime" / n for n in ("requests.py", "cli.py", "pipeline.py")]
    files += sorted((ROOT / "runtime" / "serve").glob("*.py"))
    files += sorted((ROOT / "builder").glob("*.py"))
    for path in files:
        # OpenAI's transcription form names its own fields (its "language" is the API's, handed
        # to the family's form as an argument, not a Qwen3-TTS request key the route reads)
        allowed = set(TRANSCRIPTION_FIELDS) if path.name == "transcribe.py" else set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                assert text not in literals - allowed, (path, node.lineno, text)
                assert not (re.fullmatch(r"\w+", text) and text.startswith(
                    families.STAGE_PREFIXES)), (path, node.lineno, text)  # fmt: skip


def test_the_tiny_writers_help_lists_every_family_it_accepts() -> None:
    """python -m edgeomni.export.tiny --help names each model type it takes (the toy's
    included), from the registry: a family registered later is listed too."""
    out = run(sys.executable, "-m", "edgeomni.export.tiny", "--help")
    assert out.returncode == 0, out.stderr
    listed = out.stdout.split("model types (MODEL_TYPE):", 1)[1]
    for name, model_type, _ in FAMILIES:
        assert re.search(rf"^  {model_type} +family {name}, written by ", listed, re.M), listed
    assert "edgeomni_toy" in listed


def test_every_declared_tiny_maker_imports() -> None:
    from edgeomni.export.registry import families

    makers = [f.tiny_maker() for f in families() if f.tiny]
    assert len(makers) >= 3 and all(callable(m) for m in makers)


def test_the_tensorrt_build_bench_makes_every_built_in_family() -> None:
    """bench/tensorrt_builds_gpu.py --size tiny builds each built-in family's tiny checkpoint
    (the ones under export/families/ that declare a maker)."""
    import importlib.util

    from edgeomni.export.registry import families

    path = ROOT / "bench" / "tensorrt_builds_gpu.py"
    spec = importlib.util.spec_from_file_location("tensorrt_builds_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    built_in = {f.name for f in families() if f.tiny and f.module.startswith("edgeomni.export")}
    assert built_in <= set(bench.tiny_checkpoints(Path("/nonexistent")))
