"""References installed outside the product (the ``reference`` tier): the Qwen3-TTS upstream venv,
chromium for the page test, polygraphy for the engine-dir comparison.

One that is missing, or cannot be installed, skips its tests with the reason on a developer's
machine, and fails them in CI (``CI`` set, as .ci/run sets it), so that CI cannot pass without
running them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str, ci_hint: str) -> NoReturn:
    """Skip with ``reason``; in CI fail with it, and with ``ci_hint`` (how CI provides it)."""
    if in_ci():
        pytest.fail(f"{reason}; CI is set, so these tests must run ({ci_hint})", pytrace=False)
    pytest.skip(reason)


def require_module(module: str, package: str) -> None:
    """``missing`` unless ``module`` imports (``package``, from the dev extra, provides it)."""
    if importlib.util.find_spec(module) is None:
        missing(f"{package} is not installed", f"the dev extra has {package}")


def qwen_tts_python() -> Path:
    """The upstream Qwen3-TTS reference venv's python (tests/qwen_tts_reference/make_venv.py),
    made on first use; where it cannot be made (no network the first time, no room), ``missing``."""
    from qwen_tts_reference import make_venv

    try:
        return make_venv.ensure()
    except (make_venv.VenvError, OSError) as exc:
        reason = str(exc)
    missing(
        f"cannot make the Qwen3-TTS reference venv at {make_venv.default_ref_dir()} (it needs "
        f"network access to PyPI the first time; EDGEOMNI_QWEN_TTS_REF puts it elsewhere): {reason}",
        "a CI cache keeps ~/.cache/edgeomni between runs, or the runner reaches PyPI",
    )
