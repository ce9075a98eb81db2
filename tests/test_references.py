"""A reference that cannot be installed (tests/references.py) skips with its reason on a
developer's machine and fails in CI; the tiers follow from the fixtures a test uses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import references
from qwen_tts_reference import make_venv

TESTS = Path(__file__).resolve().parent


def _no_network(ref: Path) -> dict[str, float]:
    raise make_venv.VenvError("command failed (1): pip install torch==2.13.0 (no network)")


@pytest.fixture(params=["blocked", "offline"])
def uninstallable(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch) -> Path:
    """A reference dir the venv cannot be made in: behind a file (mkdir fails), or where pip
    cannot reach its index."""
    if request.param == "blocked":
        (tmp_path / "file").write_text("")
        ref = tmp_path / "file" / "ref"
    else:
        ref = tmp_path / "ref"
        monkeypatch.setattr(make_venv, "build", _no_network)
    monkeypatch.setenv("EDGEOMNI_QWEN_TTS_REF", str(ref))
    return ref


def test_an_uninstallable_reference_skips_locally(uninstallable: Path, monkeypatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="cannot make the Qwen3-TTS reference venv"):
        references.qwen_tts_python()
    assert not make_venv.is_ready(uninstallable)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_an_uninstallable_reference_fails_in_ci(uninstallable: Path, monkeypatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="CI is set, so these tests must run"):
        references.qwen_tts_python()


@pytest.mark.parametrize("ci", ["", "false", "0"])
def test_ci_unset_or_false_is_a_developer_machine(monkeypatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="nothing_of_the_kind is not installed"):
        references.require_module("nothing_of_the_kind", "nothing_of_the_kind")


def _run_reference_test(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """One reference test of the suite, through conftest's fixture, with the venv blocked."""
    (tmp_path / "file").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["EDGEOMNI_QWEN_TTS_REF"] = str(tmp_path / "file" / "ref")
    if ci is not None:
        env["CI"] = ci
    target = f"{TESTS / 'test_qwen_tts_reference.py'}::test_manifest"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           target], capture_output=True, text=True, env=env, cwd=TESTS.parent)  # fmt: skip


@pytest.mark.parametrize("ci", [None, "true"])
def test_the_suite_skips_or_fails_without_the_reference(tmp_path: Path, ci: str | None) -> None:
    proc = _run_reference_test(tmp_path, ci)
    out = proc.stdout + proc.stderr
    if ci is None:
        assert proc.returncode == 0 and "1 skipped" in out, out
        assert "SKIPPED" in out and "cannot make the Qwen3-TTS reference venv" in out, out
    else:
        assert proc.returncode == 1 and "1 error" in out, out  # failed in its fixture's setup
        assert "CI is set, so these tests must run" in out, out
