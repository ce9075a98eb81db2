"""Create the Qwen3-TTS reference venv: upstream qwen-tts 0.1.1, unmodified, on transformers 4.57.3.

Standard library only; run it with any Python 3.10+ (the project venv's is fine):

    .venv/bin/python tests/qwen_tts_reference/make_venv.py [REF_DIR]

REF_DIR defaults to ``default_ref_dir()`` ($EDGEOMNI_QWEN_TTS_REF, else
$XDG_CACHE_HOME/edgeomni/qwen-tts-ref-0.1.1, else ~/.cache/edgeomni/qwen-tts-ref-0.1.1).
Idempotent: a marker file (``edgeomni-ref.json``) holding the recipe below is written last, and a
venv whose marker matches is reused as is; anything else at REF_DIR (a half-made venv, an older
recipe) is removed and rebuilt. A lock file next to it keeps two sessions from building at once.

The recipe (families.md, "The upstream reference, unmodified, in its own venv"):
1. ``python -m venv REF``; ``pip install torch==2.13.0`` (the CPU wheel; from the local wheel
   cache where there is one, else PyPI's index, which needs ``--index-url`` for the CPU build:
   see ``TORCH_INDEX``).
2. ``pip install transformers==4.57.3`` and the runtime deps qwen-tts imports (librosa,
   soundfile, einops, sox, onnxruntime), pinned; then ``--no-deps qwen-tts==0.1.1`` and
   ``--no-deps torchaudio==2.11.1`` (qwen-tts's accelerate and gradio pins are not needed to
   generate, and pulling gradio takes most of a full install's time).
3. Shim: torchaudio 2.11.1 on PyPI is a CUDA build whose ``lib/*.so`` do not load with CPU
   torch; they are renamed to ``*.so.disabled``. qwen-tts only imports
   ``torchaudio.compliance.kaldi`` (pure Python), through its 25 Hz tokenizer, at import time.
4. Check and warm up: import qwen_tts, and ``librosa.load`` a short WAV once, so that numba's
   one-off compile (~14 s, cached inside the venv) is paid here rather than by the first test.

Exit status 0 and the venv's python path on stdout; on failure, status 1 and pip's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MARKER = "edgeomni-ref.json"
TORCH = ["torch==2.13.0"]
DEPS = [
    "transformers==4.57.3",
    "librosa==0.11.0",
    "soundfile==0.14.0",
    "einops==0.8.2",
    "sox==1.5.0",
    "onnxruntime==1.32.0",
    "numpy==2.4.6",
]
NO_DEPS = ["qwen-tts==0.1.1", "torchaudio==2.11.1"]
# Bump "recipe" when the steps change, so that cached venvs are rebuilt.
RECIPE = {
    "recipe": 1,
    "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    "torch": TORCH,
    "deps": DEPS,
    "no_deps": NO_DEPS,
    "shim": "torchaudio/lib/*.so renamed *.so.disabled",
}
# Where torch==2.13.0 is not in a local wheel cache, PyPI's default index serves the CUDA build
# (several GB of nvidia-* wheels); the CPU one comes from PyTorch's index.
TORCH_INDEX = os.environ.get("EDGEOMNI_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")

WARMUP = """
import sys, numpy as np, soundfile as sf
import qwen_tts, transformers, torch
assert transformers.__version__ == "4.57.3", transformers.__version__
import librosa
path = sys.argv[1]
sf.write(path, np.zeros(2400, np.float32), 24000)
librosa.load(path, sr=None, mono=True)
print(qwen_tts.__file__, transformers.__version__, torch.__version__)
"""


def default_ref_dir() -> Path:
    env = os.environ.get("EDGEOMNI_QWEN_TTS_REF")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edgeomni" / "qwen-tts-ref-0.1.1"


def ref_python(ref: Path) -> Path:
    return ref / "bin" / "python"


def is_ready(ref: Path) -> bool:
    marker = ref / MARKER
    if not (marker.is_file() and ref_python(ref).exists()):
        return False
    try:
        return json.loads(marker.read_text()).get("recipe") == RECIPE
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def locked(ref: Path) -> Iterator[None]:
    import fcntl

    ref.parent.mkdir(parents=True, exist_ok=True)
    with open(ref.parent / f"{ref.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class VenvError(RuntimeError):
    pass


def _run(cmd: list[str], log: list[str]) -> None:
    log.append("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    # pip's "Location ... is ignored" lines (extra index URLs that lack a package) are noise.
    lines = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if "is neither a file nor a directory" not in line
    ]
    log.extend(lines[-40:])
    if proc.returncode != 0:
        raise VenvError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n" + "\n".join(log))


def _torch_available_locally(pip: list[str], log: list[str]) -> bool:
    """True when pip resolves torch==2.13.0 without PyTorch's index (a local wheel cache)."""
    proc = subprocess.run(
        [*pip, "install", "--dry-run", "--no-deps", "--no-index", *TORCH],
        capture_output=True,
        text=True,
    )
    log.append(f"torch from a local wheel cache: {proc.returncode == 0}")
    return proc.returncode == 0


def build(ref: Path) -> dict[str, float]:
    """Make the venv at ``ref`` from nothing; returns the seconds each step took."""
    times: dict[str, float] = {}
    log: list[str] = []
    if ref.exists():
        shutil.rmtree(ref)
    t0 = time.perf_counter()
    _run([sys.executable, "-m", "venv", str(ref)], log)
    py = str(ref_python(ref))
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    times["venv"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    torch_cmd = [*pip, *TORCH]
    if not _torch_available_locally([py, "-m", "pip"], log):
        torch_cmd += ["--index-url", TORCH_INDEX]
    _run(torch_cmd, log)
    times["torch"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _run([*pip, *DEPS], log)
    _run([*pip, "--no-deps", *NO_DEPS], log)
    times["deps"] = time.perf_counter() - t0

    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for so in sorted((site / "torchaudio" / "lib").glob("*.so")):
        so.rename(so.with_name(so.name + ".disabled"))

    t0 = time.perf_counter()
    _run([py, "-c", WARMUP, str(ref / "warmup.wav")], log)
    times["check"] = time.perf_counter() - t0
    (ref / MARKER).write_text(json.dumps({"recipe": RECIPE, "seconds": times}, indent=2) + "\n")
    return times


def ensure(ref: Path | None = None) -> Path:
    """The reference venv's python, building the venv first unless a matching one is there."""
    ref = (ref or default_ref_dir()).expanduser().absolute()
    if is_ready(ref):
        return ref_python(ref)
    with locked(ref):
        if not is_ready(ref):  # another process may have built it while we waited
            build(ref)
    return ref_python(ref)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ref = Path(args[0]) if args else default_ref_dir()
    t0 = time.perf_counter()
    try:
        py = ensure(ref)
    except VenvError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(py)
    print(f"ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
