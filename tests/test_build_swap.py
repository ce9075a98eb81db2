"""edge-build's workspace and swap under stale litter, signals and kills: a previous build is
never lost, a stale workspace is cleaned by the next build, a live one is left alone, and an
interrupted or killed real build (the tiny Qwen3 in a subprocess) leaves nothing behind. Split
from tests/test_build_faults.py, whose table covers bad input."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from build_checks import LIBRARY_TMP, manifest_matches, snapshot

from edgeomni.builder import cli, interrupts, manifest
from edgeomni.builder.errors import BuildError
from edgeomni.builder.workspace import clean_stale, workspace

MANIFEST = manifest.MANIFEST
SIZES = ("--max-batch-size", "2", "--max-input-len", "32", "--max-kv-cache-capacity", "64")
OK = cli.EXIT_OK

# ---- stale workspaces, the second check and the held swap (no build: fast)


def stale(eng: Path, pid: int = 999_999_999) -> Path:
    ws = eng.parent / f".{eng.name}.edge-build-{pid}"
    (ws / "staging").mkdir(parents=True)
    (ws / "lock").touch()
    return ws


def test_split_swap_is_undone(qwen3_engine: Path, tmp_path: Path, logs) -> None:
    """Killed between the swap's two renames: the engine dir is gone, its build in previous/."""
    eng = tmp_path / "eng"
    ws = stale(eng)
    shutil.copytree(qwen3_engine, ws / "previous")
    clean_stale(eng)
    assert snapshot(eng) == snapshot(qwen3_engine)
    assert os.listdir(tmp_path) == ["eng"]
    assert f"removed {ws}, left by a build that did not finish; put its previous build" in logs.text


def test_stale_after_the_swap_is_removed(qwen3_engine: Path, tmp_path: Path, logs) -> None:
    eng = shutil.copytree(qwen3_engine, tmp_path / "eng")
    ws = stale(eng)
    shutil.rmtree(ws / "staging")  # renamed to eng: the swap was done
    shutil.copytree(qwen3_engine, ws / "previous")
    clean_stale(eng)
    assert os.listdir(tmp_path) == ["eng"] and snapshot(eng) == snapshot(qwen3_engine)


def test_split_swap_with_a_new_engine_dir_keeps_the_previous_build(
    qwen3_engine: Path, tmp_path: Path, logs
) -> None:
    eng = tmp_path / "eng"
    ws = stale(eng)
    shutil.copytree(qwen3_engine, ws / "previous")
    eng.mkdir()  # someone made it again
    clean_stale(eng)
    assert snapshot(ws / "previous") == snapshot(qwen3_engine)
    assert "exists again: kept it" in logs.text


def test_live_workspaces_are_left_alone(tmp_path: Path, logs) -> None:
    eng = tmp_path / "eng"
    held = stale(eng, 1)
    lock = os.open(held / "lock", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a build that runs
    making = stale(eng, os.getpid())
    (making / "lock").unlink()  # a build making its workspace right now: no lock file yet
    old = tmp_path / ".eng.partial-k2j4h5l6"  # the previous edge-build's staging dir
    old.mkdir()
    try:
        before = snapshot(tmp_path)
        clean_stale(eng)
        assert snapshot(tmp_path) == before
    finally:
        os.close(lock)
    assert f"{old} was left by an older edge-build; remove it if no edge-build is running" in (
        logs.text
    )
    assert "removed" not in logs.text


def test_files_added_during_the_build_stop_the_swap(qwen3_engine: Path, tmp_path: Path) -> None:
    eng = shutil.copytree(qwen3_engine, tmp_path / "eng")
    with pytest.raises(BuildError, match="did not write: predictions.json"), workspace(eng) as ws:
        (ws.staging / "llm.onnx").write_text("new")
        (eng / "predictions.json").write_text("[]")  # while the build ran
        ws.commit()
    (eng / "predictions.json").unlink()
    assert snapshot(eng) == snapshot(qwen3_engine) and os.listdir(tmp_path) == ["eng"]


def test_a_signal_cannot_split_the_swap(qwen3_engine: Path, tmp_path: Path, monkeypatch, logs):
    from edgeomni.builder import workspace as ws_module

    eng = shutil.copytree(qwen3_engine, tmp_path / "eng")
    rename = os.rename

    def rename_then_signal(src: Path, dst: Path) -> None:
        rename(src, dst)
        os.kill(os.getpid(), signal.SIGTERM)  # between the two renames

    monkeypatch.setattr(ws_module.os, "rename", rename_then_signal)
    with interrupts.raised(), workspace(eng) as ws:
        (ws.staging / "new.txt").write_text("the new build")
        ws.commit()
        assert interrupts.taken() is None
    assert os.listdir(eng) == ["new.txt"] and os.listdir(tmp_path) == ["eng"]
    assert "interrupted while the new build was being put in place; it is in place" in logs.text


def test_a_second_signal_cannot_cut_the_cleanup_short(tmp_path: Path, monkeypatch) -> None:
    from edgeomni.builder import workspace as ws_module

    eng = tmp_path / "eng"
    remove = ws_module.remove_workspace

    def signal_then_remove(path: Path, engine_dir: Path) -> bool | None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the SIGTERM's cleanup runs
        return remove(path, engine_dir)

    monkeypatch.setattr(ws_module, "remove_workspace", signal_then_remove)
    handlers = {sig: signal.getsignal(sig) for sig in interrupts.STOP}
    try:
        with pytest.raises(interrupts.Terminated), interrupts.raised(), workspace(eng):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises before this ends
        assert os.listdir(tmp_path) == []  # the workspace went all the same
        # the exiting process now ignores both, so no late signal changes its exit status
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


STOPPED_IN_A_C_EVAL = """
import ctypes, os, sys
from edgeomni.builder import interrupts

run = ctypes.pythonapi.PyRun_String
run.restype = ctypes.py_object
run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
code = b"__import__('os').kill(__import__('os').getpid(), 2) or __import__('time').sleep(5)"
status = 0
with interrupts.raised():
    try:
        run(code, 258, {}, {})  # as pybind11's py::exec runs Python inside torch
    except KeyboardInterrupt as e:
        status = interrupts.exit_status(e, interrupts.taken())
sys.exit(status)
"""


def test_an_interrupt_caught_after_a_c_eval_still_exits_130(tmp_path: Path) -> None:
    """Under python -m, CPython kills itself with SIGINT at exit after a KeyboardInterrupt left
    a C-level eval, whatever status main returned: the build's -2 in CI (2026-12-05)."""
    (tmp_path / "stopped_in_c_eval.py").write_text(STOPPED_IN_A_C_EVAL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "stopped_in_c_eval"], env=env, timeout=60,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 130, done.stderr


def test_help_tells_the_exit_statuses(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "130 (SIGINT) or 143 (SIGTERM) interrupted, ENG left as it was" in out
    assert "1 internal error (one line; -v shows the traceback) or a system error" in out
    assert "kept as multistage_config.json.orig" in out and "edgeomni_manifest.json" in out


# ---- real builds, interrupted (subprocess)


def start(ckpt: Path, eng: Path, tmp: Path) -> tuple[subprocess.Popen, Path, Path]:
    """edge-build in a subprocess, its TMPDIR and stderr under tmp; returns once it exports."""
    tmpdir, log = tmp / "tmpdir", tmp / "stderr.txt"
    tmpdir.mkdir()
    cmd = [sys.executable, "-m", "edgeomni.builder.cli",
           "--model-dir", str(ckpt), "--engine-dir", str(eng), *SIZES]  # fmt: skip
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stderr=err, env={**os.environ, "TMPDIR": str(tmpdir)})
    ws = eng.parent / f".{eng.name}.edge-build-{proc.pid}"
    deadline = time.monotonic() + 120
    while not (ws.is_dir() and "export llm to ONNX ..." in log.read_text()):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the build never started its export"
        time.sleep(0.05)
    return proc, tmpdir, log


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "code"),
    [
        pytest.param(signal.SIGINT, 130, id="SIGINT"),
        pytest.param(signal.SIGTERM, 143, id="SIGTERM"),
    ],
)
def test_interrupted_build_leaves_nothing(
    qwen3_ckpt: Path, qwen3_engine: Path, tmp_path: Path, sig: int, code: int
) -> None:
    eng = shutil.copytree(qwen3_engine, tmp_path / "out" / "eng")
    before = snapshot(eng)
    proc, tmpdir, log = start(qwen3_ckpt, eng, tmp_path)
    proc.send_signal(sig)
    # -2 here was the C-level eval's mark (see the test above); its stderr shows what ran
    assert proc.wait(timeout=60) == code, log.read_text()[-2000:]
    lines = log.read_text().splitlines()
    after = lines[lines.index("edge-build: export llm to ONNX ...") + 1 :]
    assert after == [f"edge-build: interrupted; {eng} was left as it was"]
    assert "Traceback" not in log.read_text()
    assert os.listdir(eng.parent) == ["eng"] and snapshot(eng) == before
    assert not set(os.listdir(tmpdir)) - LIBRARY_TMP


@pytest.mark.slow
def test_killed_build_is_cleaned_by_the_next(
    qwen3_ckpt: Path, qwen3_engine: Path, tmp_path: Path, logs
) -> None:
    eng = shutil.copytree(qwen3_engine, tmp_path / "out" / "eng")
    proc, _, _ = start(qwen3_ckpt, eng, tmp_path)
    proc.kill()
    proc.wait(timeout=60)
    (ws,) = [p for p in eng.parent.iterdir() if p.name != "eng"]
    assert cli.main(["--model-dir", str(qwen3_ckpt), "--engine-dir", str(eng), *SIZES]) == OK
    assert f"removed {ws}, left by a build that did not finish" in logs.text
    assert os.listdir(eng.parent) == ["eng"]
    manifest_matches(eng)
