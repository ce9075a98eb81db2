"""Shared fixtures: tiny random checkpoints and engines built from them (once per session)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _signal_handlers():
    """A command stopped by a signal in-process leaves SIGINT and SIGTERM ignored, as a process
    about to exit should (builder/interrupts.py); the next test gets pytest's handlers back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session")
def qwen3_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.tiny import make_qwen3

    return make_qwen3(tmp_path_factory.mktemp("qwen3") / "ckpt")


@pytest.fixture(scope="session")
def qwen3_engine(qwen3_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("qwen3-engine") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=128)
    graph = build(qwen3_ckpt, engine_dir, args)
    assert graph is not None and graph.is_file()
    return engine_dir


@pytest.fixture(scope="session")
def omni_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.tiny_omni import make_qwen3_omni

    return make_qwen3_omni(tmp_path_factory.mktemp("omni") / "ckpt")


@pytest.fixture(scope="session")
def omni_engine(omni_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("omni-engine") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)
    assert build(omni_ckpt, engine_dir, args) is not None
    return engine_dir
