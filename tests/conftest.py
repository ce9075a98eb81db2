"""Shared fixtures: tiny random checkpoints and engines built from them (once per session)."""

from __future__ import annotations

import importlib
import logging
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import references
from export_store import ExportStore

# The Qwen3-TTS reference run (make_reference.py: one thread, some 12 s), started as collection
# ends when a selected test needs it and the venv is there, so that it runs beside the tests
# before its first user; the qwen_tts_reference fixture waits for it.
_early_reference: dict[str, Any] = {}


# The tiers (pyproject.toml's markers) follow from the fixtures a test uses, so that a new test is
# tiered by what it needs: every engine build goes through the session's export store (slow), and
# a reference installed outside the product is one fixture each (tests/references.py).
TIER_FIXTURES = {
    "exports": "slow",
    "qwen_tts_python": "reference",
    "browser": "reference",  # chromium, tests/test_serve_page.py
    "polygraphy": "reference",  # tests/test_tensorrt_compare.py
}


_running: list[pytest.Item] = []  # the test being run, for _tiered


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in TIER_FIXTURES.items():
            if fixture in used:
                item.add_marker(marker)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


def _tiered(fixture: str) -> None:
    """A test that reaches a tier's fixture only through ``request.getfixturevalue`` is not
    marked by collection; in a run that deselects the tier, it fails here instead of building."""
    marker = TIER_FIXTURES[fixture]
    if _running and _running[-1].get_closest_marker(marker) is None:
        pytest.fail(f"{_running[-1].nodeid} sets up {fixture!r} (through getfixturevalue) but is "
                    f"not marked {marker!r}: mark it (tests/conftest.py, TIER_FIXTURES)",
                    pytrace=False)  # fmt: skip


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


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the test (tiny ops: thread hand-offs cost more than they give),
    its count restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExportStore]:
    """The session's raw ONNX exports (tests/export_store.py): a build by ``exports.build`` (or
    inside ``exports.reused()``) runs each distinct export once and reuses its files after."""
    _tiered("exports")
    store = ExportStore(tmp_path_factory.mktemp("exports"))
    yield store
    store.close()


def _cpu_engine(exports: ExportStore, ckpt: Path, engine_dir: Path, rows: int, prompt: int,
                kv: int) -> Path:  # fmt: skip
    """``ckpt`` built for the CPU into ``engine_dir`` (``rows`` rows, prompts of ``prompt``
    tokens, ``kv`` cache slots) through the session's exports; read-only for its users."""
    from edgeomni.export.family import BuildArgs

    args = BuildArgs(max_batch_size=rows, max_input_len=prompt, max_kv_cache_capacity=kv)
    graph = exports.build(ckpt, engine_dir, args)
    assert graph is not None and graph.is_file()
    return engine_dir


# The tiny random checkpoints and their CPU engines, once per session: ``<name>_ckpt`` (the
# export/tiny*.py maker's output) and ``<name>_engine`` (rows, prompt tokens, cache slots;
# vl's holds the llm and visual/, asr's prompts of 128 tokens are about 9 s of audio).
TINY = {
    "qwen3": ("edgeomni.export.tiny", "make_qwen3", 3, 64, 128),
    "omni": ("edgeomni.export.tiny_omni", "make_qwen3_omni", 3, 128, 256),
    "vl": ("edgeomni.export.tiny_vl", "make_qwen3_vl", 3, 256, 384),
    "asr": ("edgeomni.export.tiny_asr", "make_qwen3_asr", 3, 128, 256),
    "qwen35": ("edgeomni.export.families.qwen3_5.tiny", "make_qwen3_5", 3, 64, 128),
}


def _tiny_fixtures(name: str) -> tuple[Any, Any]:
    module, maker, rows, prompt, kv = TINY[name]

    def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
        make = getattr(importlib.import_module(module), maker)
        return make(tmp_path_factory.mktemp(name) / "ckpt")

    def engine(request: pytest.FixtureRequest, exports: ExportStore, tmp_path_factory) -> Path:
        engine_dir = tmp_path_factory.mktemp(f"{name}-engine") / "eng"
        built = request.getfixturevalue(f"{name}_ckpt")
        return _cpu_engine(exports, built, engine_dir, rows, prompt, kv)

    return (pytest.fixture(ckpt, scope="session", name=f"{name}_ckpt"),
            pytest.fixture(engine, scope="session", name=f"{name}_engine"))  # fmt: skip


qwen3_ckpt, qwen3_engine = _tiny_fixtures("qwen3")
omni_ckpt, omni_engine = _tiny_fixtures("omni")
vl_ckpt, vl_engine = _tiny_fixtures("vl")
asr_ckpt, asr_engine = _tiny_fixtures("asr")
qwen35_ckpt, qwen35_engine = _tiny_fixtures("qwen35")


@pytest.fixture(scope="session")
def tts_engine(exports: ExportStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-TTS CustomVoice checkpoint (export/tiny_tts.py, in ``../ckpt``),
    built for the CPU (edge-serve's tests, the family walk, the TensorRT profiles and upstream's
    reading of the checkpoint share the build)."""
    from edgeomni.export.tiny_tts import make_checkpoint

    root = tmp_path_factory.mktemp("serve-tts")
    ckpt = make_checkpoint(root / "ckpt", "custom_voice", "tiny")
    return _cpu_engine(exports, ckpt, root / "eng", 2, 64, 128)


@pytest.fixture(scope="session")
def tts_base_engine(exports: ExportStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-TTS Base checkpoint (its clone encoders, the in-context prompt)
    built for the CPU, 2 rows (the context cache's tests share it)."""
    from edgeomni.export.tiny_tts import make_checkpoint

    root = tmp_path_factory.mktemp("tts-base")
    ckpt = make_checkpoint(root / "ckpt", "base", "tiny")
    return _cpu_engine(exports, ckpt, root / "eng", 2, 128, 256)


@pytest.fixture(scope="session")
def qwen_tts_python() -> Path:
    """The upstream Qwen3-TTS reference venv's python (qwen-tts 0.1.1 on transformers 4.57.3).

    Built once by tests/qwen_tts_reference/make_venv.py and cached outside the repo, under
    $EDGEOMNI_QWEN_TTS_REF or ~/.cache/edgeomni/qwen-tts-ref-0.1.1 (see make_venv.default_ref_dir):
    a venv inside the checkout would be wiped by ``git clean`` and ``pytest --cache-clear``, and
    ~/.cache is what CI caches keep between runs. Needs network (PyPI, or a local wheel cache) the
    first time; without it the tests skip, saying why, and fail in CI (tests/references.py).
    """
    _tiered("qwen_tts_python")
    return references.qwen_tts_python()


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
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            ckpt = Path(qwen_tts_reference["checkpoints"][kind]["dir"])
            engine_dir = tmp_path_factory.mktemp(f"tts-{kind}") / "eng"
            built[kind] = _cpu_engine(exports, ckpt, engine_dir, 3, 128, 256)
        return built[kind]

    return get


def _trained_baseline(
    exports: ExportStore, tmp_path_factory: pytest.TempPathFactory, ckpt: Path, name: str
) -> Any:
    """A trained checkpoint built as a float32 engine, and that engine's held-out scores."""
    from trained_qwen3 import perplexity as ppl

    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp(name) / "fp32"
    assert exports.build(ckpt, engine_dir, BuildArgs(**ppl.BUILD)) is not None
    ids = ppl.heldout_ids(ppl.N_WINDOWS, ppl.WINDOW, ckpt)
    scores = ppl.engine_perplexity(engine_dir, ids, ppl.WINDOW, ppl.BATCH, keep_logprobs=True)
    return ppl.Baseline(ckpt, engine_dir, ids, scores)


@pytest.fixture(scope="session")
def trained_qwen3(exports: ExportStore, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The trained tiny Qwen3 (tests/trained_qwen3/ckpt) built as a float32 engine, and that
    engine's held-out scores: a trained_qwen3.perplexity.Baseline, the reference quantized
    engines of the same checkpoint are measured against (read-only)."""
    from trained_qwen3 import perplexity as ppl

    return _trained_baseline(exports, tmp_path_factory, ppl.CKPT, "trained-qwen3")


@pytest.fixture(scope="session")
def trained_qwen35(exports: ExportStore, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same for the tiny Qwen3.5 trained on the same text (tests/trained_qwen35/ckpt): its
    DeltaNet layers carry recurrent and convolution state, which int4 weights must not spoil."""
    from trained_qwen3 import perplexity as ppl

    return _trained_baseline(exports, tmp_path_factory, ppl.CKPT_QWEN3_5, "trained-qwen35")


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """edge-build's log, from INFO (tests/test_build_faults.py, tests/test_build_swap.py)."""
    caplog.set_level(logging.INFO, logger="edge-build")
    return caplog
