"""Shared fixtures: tiny random checkpoints and engines built from them (once per session)."""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from export_store import ExportStore

# The Qwen3-TTS reference run (make_reference.py: one thread, some 12 s), started as collection
# ends when a selected test needs it and the venv is there, so that it runs beside the tests
# before its first user; the qwen_tts_reference fixture waits for it.
_early_reference: dict[str, Any] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or not any(
        "qwen_tts_reference" in getattr(item, "fixturenames", ()) for item in session.items
    ):
        return
    from qwen_tts_reference import make_venv
    from qwen_tts_reference.harness import Reference

    ref = make_venv.default_ref_dir().expanduser().absolute()
    if make_venv.is_ready(ref):  # else the fixtures make the venv, or say why they cannot
        out = Path(tempfile.mkdtemp(prefix="edgeomni-qwen-tts-ref-"))
        _early_reference.update(folder=out, run=Reference(make_venv.ref_python(ref), out))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "run" in _early_reference:
        _early_reference.pop("run").stop()
    if "folder" in _early_reference:
        shutil.rmtree(_early_reference.pop("folder"), ignore_errors=True)


@pytest.fixture(autouse=True)
def _signal_handlers():
    """A command stopped by a signal in-process leaves SIGINT and SIGTERM ignored, as a process
    about to exit should (builder/interrupts.py); the next test gets pytest's handlers back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExportStore]:
    """The session's raw ONNX exports (tests/export_store.py): a build by ``exports.build`` (or
    inside ``exports.reused()``) runs each distinct export once and reuses its files after."""
    store = ExportStore(tmp_path_factory.mktemp("exports"))
    yield store
    store.close()


@pytest.fixture(scope="session")
def qwen3_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.tiny import make_qwen3

    return make_qwen3(tmp_path_factory.mktemp("qwen3") / "ckpt")


@pytest.fixture(scope="session")
def qwen3_engine(
    qwen3_ckpt: Path, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("qwen3-engine") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=128)
    graph = exports.build(qwen3_ckpt, engine_dir, args)
    assert graph is not None and graph.is_file()
    return engine_dir


@pytest.fixture(scope="session")
def omni_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.tiny_omni import make_qwen3_omni

    return make_qwen3_omni(tmp_path_factory.mktemp("omni") / "ckpt")


@pytest.fixture(scope="session")
def omni_engine(
    omni_ckpt: Path, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("omni-engine") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)
    assert exports.build(omni_ckpt, engine_dir, args) is not None
    return engine_dir


@pytest.fixture(scope="session")
def vl_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.tiny_vl import make_qwen3_vl

    return make_qwen3_vl(tmp_path_factory.mktemp("vl") / "ckpt")


@pytest.fixture(scope="session")
def vl_engine(
    vl_ckpt: Path, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny Qwen3-VL built for the CPU (read-only): the llm and visual/."""
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("vl-engine") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=256, max_kv_cache_capacity=384)
    assert exports.build(vl_ckpt, engine_dir, args) is not None
    return engine_dir


@pytest.fixture(scope="session")
def asr_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.tiny_asr import make_qwen3_asr

    return make_qwen3_asr(tmp_path_factory.mktemp("asr") / "ckpt")


@pytest.fixture(scope="session")
def asr_engine(
    asr_ckpt: Path, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny Qwen3-ASR built for the CPU: 3 rows, prompts of 128 tokens (about 9 s of
    audio), 256 cache slots (read-only)."""
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("asr-engine") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)
    assert exports.build(asr_ckpt, engine_dir, args) is not None
    return engine_dir


@pytest.fixture(scope="session")
def tts_engine(exports: ExportStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-TTS CustomVoice checkpoint (export/tiny_tts.py, in ``../ckpt``),
    built for the CPU (edge-serve's tests, the family walk, the TensorRT profiles and upstream's
    reading of the checkpoint share the build; read-only)."""
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.tiny_tts import make_checkpoint

    root = tmp_path_factory.mktemp("serve-tts")
    ckpt = make_checkpoint(root / "ckpt", "custom_voice", "tiny")
    args = BuildArgs(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)
    assert exports.build(ckpt, root / "eng", args) is not None
    return root / "eng"


@pytest.fixture(scope="session")
def qwen_tts_python() -> Path:
    """The upstream Qwen3-TTS reference venv's python (qwen-tts 0.1.1 on transformers 4.57.3).

    Built once by tests/qwen_tts_reference/make_venv.py and cached outside the repo, under
    $EDGEOMNI_QWEN_TTS_REF or ~/.cache/edgeomni/qwen-tts-ref-0.1.1 (see make_venv.default_ref_dir):
    a venv inside the checkout would be wiped by ``git clean`` and ``pytest --cache-clear``, and
    ~/.cache is what CI caches keep between runs. Needs network (PyPI, or a local wheel cache) the
    first time; without it this FAILS rather than skips, since the Qwen3-TTS parity tests mean
    nothing without their reference.
    """
    from qwen_tts_reference import make_venv

    try:
        return make_venv.ensure()
    except make_venv.VenvError as exc:
        reason = str(exc)
    pytest.fail(
        f"cannot make the Qwen3-TTS reference venv at {make_venv.default_ref_dir()} "
        f"(it needs network access to PyPI the first time; set EDGEOMNI_QWEN_TTS_REF to use "
        f"another place): {reason}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def qwen_tts_reference(qwen_tts_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Greedy upstream runs of the tiny Qwen3-TTS checkpoints (every mode, once per session).

    The manifest of tests/qwen_tts_reference/make_reference.py: ``modes[name]`` gives the
    checkpoint dir, the request and ``npz`` (codes int64 [frames, 16], wav float32 at 24 kHz;
    Base adds spk_embedding and, for ICL, ref_codes). Started as collection ends where the venv
    is ready (pytest_collection_finish above); here it is waited for.
    """
    from qwen_tts_reference.harness import run_reference

    early = _early_reference.get("run")
    if early is not None and early.python == qwen_tts_python:
        return early.manifest()
    return run_reference(qwen_tts_python, tmp_path_factory.mktemp("qwen-tts-ref"))


@pytest.fixture(scope="session")
def qwen_tts_engines(
    qwen_tts_reference: dict, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
):
    """Engine dirs built by edge-build's path from the reference's tiny Qwen3-TTS checkpoints:
    ``get(kind)`` (custom_voice, voice_design or base) builds one on first use (batch 3, input
    128, kv 256)."""
    from edgeomni.export.family import BuildArgs

    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            ckpt = Path(qwen_tts_reference["checkpoints"][kind]["dir"])
            engine_dir = tmp_path_factory.mktemp(f"tts-{kind}") / "eng"
            args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)
            assert exports.build(ckpt, engine_dir, args) is not None
            built[kind] = engine_dir
        return built[kind]

    return get


@pytest.fixture(scope="session")
def trained_qwen3(exports: ExportStore, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The trained tiny Qwen3 (tests/trained_qwen3/ckpt) built as a float32 engine, and that
    engine's held-out scores: a trained_qwen3.perplexity.Baseline, the reference quantized
    engines of the same checkpoint are measured against (read-only)."""
    from trained_qwen3 import perplexity as ppl

    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("trained-qwen3") / "fp32"
    assert exports.build(ppl.CKPT, engine_dir, BuildArgs(**ppl.BUILD)) is not None
    ids = ppl.heldout_ids(ppl.N_WINDOWS, ppl.WINDOW)
    scores = ppl.engine_perplexity(engine_dir, ids, ppl.WINDOW, ppl.BATCH, keep_logprobs=True)
    return ppl.Baseline(ppl.CKPT, engine_dir, ids, scores)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """edge-build's log, from INFO (tests/test_build_faults.py, tests/test_build_swap.py)."""
    caplog.set_level(logging.INFO, logger="edge-build")
    return caplog
