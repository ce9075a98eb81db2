"""Where edge-infer's outputs may go: every output destination checked before any work (a
missing or unwritable folder, an output that is one of the run's inputs, one inside or being an
engine dir edge-build wrote), so that a run never destroys what it reads or what a rebuild
needs."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeomni.builder.manifest import MANIFEST  # beside the files of an engine dir edge-build wrote
from edgeomni.runtime.families import REQUEST_KEYS as FAMILY_KEYS

PATH_KEYS = tuple(key for key, k in FAMILY_KEYS.items() if k.path)


def destination_error(
    args: argparse.Namespace, requests: Sequence[Any], engine: Mapping[str, str] | None = None
) -> str | None:
    """What stops the outputs from being written, found before any work: a missing or
    unwritable folder, a directory where a file goes, an output that is one of the run's
    inputs (the request file, a media file, and ``engine``: every file the graph's stages
    read, realpath -> what it is), or one inside an engine dir edge-build wrote. None when
    they can all be written."""
    from edgeomni.runtime.prompt import media_parts
    from edgeomni.runtime.requests import BadRequest

    inputs = dict(engine or {})
    if args.input_file is not None:
        inputs[os.path.realpath(args.input_file)] = "the --input-file"
    for request in requests:
        if isinstance(request, BadRequest):  # its messages are as written, not checked
            continue
        for part in media_parts(request.messages):
            for path in part.files():
                inputs.setdefault(os.path.realpath(path), f"the {part.kind} file {path}")
        for key in PATH_KEYS:
            ref = request.speech.get(key)
            if ref:
                inputs.setdefault(os.path.realpath(ref), f"the {key} file {ref}")
    files = [(f, p) for f, p in (("--output-file", args.output_file),
                                 ("--out-audio", args.out_audio)) if p is not None]  # fmt: skip
    for flag, path in files:
        problem = _file_destination(path) or _is_input(path, inputs) or _in_engine_dir(path)
        if problem:
            return f"{flag} {path}: {problem}"
    if len(files) == 2 and os.path.realpath(files[0][1]) == os.path.realpath(files[1][1]):
        return f"--output-file and --out-audio are the same file ({args.out_audio})"
    folder = args.output_audio_dir
    if folder is not None:
        problem = _dir_destination(folder) or _in_engine_dir(folder, folder=True)
        for i in range(len(requests)):
            for name in (f"audio_req{i}.wav", f"rvq_req{i}.safetensors"):
                clash = _is_input(folder / name, inputs)
                problem = problem or (clash and f"{name} {clash}")
        if problem:
            return f"--output-audio-dir {folder}: {problem}"
    return None


# what a stage folder, and the folders under it (encoders, code predictor), hold for their
# runners, with the external data each engine's ONNX names: the files no output may replace
STAGE_FILES = ("*.safetensors", "*.onnx", "*.data", "*.engine", "*.jinja", "config.json",
               "*_config.json", "tokenizer.json", "chat_template.json", "vocab.json",
               "merges.txt", "timing.cache")  # fmt: skip


def engine_inputs(pipeline: Any) -> dict[str, str]:
    """Every file the graph's stages read (realpath -> what it is): the graph, each stage's
    config, engine and its external data, tables, tokenizer and chat template."""
    from edgeomni.runtime.artifacts import CONFIG
    from edgeomni.runtime.onnx_header import check_onnx_file
    from edgeomni.runtime.pipeline import resolve_config

    out = {os.path.realpath(resolve_config(pipeline.engine_dir)): "the graph (--config)"}
    # the deepest folders first: a file is named after the stage whose own folder holds it
    stages = sorted(pipeline.graph.stages, key=lambda s: -len(Path(s.artifact).parts))
    for stage in stages:
        folder = pipeline.engine_dir / stage.artifact
        what = f"a file of stage {stage.id!r}"
        found = {p for pattern in STAGE_FILES for p in folder.rglob(pattern) if p.is_file()}
        for config in [p for p in found if p.name == CONFIG]:
            try:
                engine = json.loads(config.read_text(encoding="utf-8")).get("engine")
                if isinstance(engine, str) and engine.endswith(".onnx"):
                    found.update(check_onnx_file(config.parent / engine))
            except (OSError, ValueError, AttributeError):  # OnnxFileError is a ValueError
                pass  # a broken stage is found when it is opened, and named there
        for path in found:
            out.setdefault(os.path.realpath(path), f"{what} ({path.name})")
    return out


def _in_engine_dir(path: Path, folder: bool = False) -> str | None:
    """An output inside an engine dir that edge-build wrote (its manifest beside its files),
    or with ``folder`` an output folder that is one: refused, since it could replace a file of
    the build and would stop its next rebuild."""
    real = Path(os.path.realpath(path))
    why = "write outputs elsewhere (a rebuild refuses a dir holding files it did not write)"
    if folder and (real / MANIFEST).is_file():
        return f"is an engine dir edge-build wrote; {why}"
    for parent in real.parents:
        if (parent / MANIFEST).is_file():
            return f"lies inside {parent}, an engine dir edge-build wrote; {why}"
    return None


def _is_input(path: Path, inputs: dict[str, str]) -> str | None:
    what = inputs.get(os.path.realpath(path))
    return f"is {what}; writing it would destroy an input of this run" if what else None


def _file_destination(path: Path) -> str | None:
    """Outputs go to a temporary file beside the real path (a symlink is followed), renamed
    over it: the real path must be a regular file or nothing yet."""
    real = Path(os.path.realpath(path))
    if real.is_dir():
        return "is a directory; give a file path"
    if real.exists() and not real.is_file():
        return "is not a regular file (outputs are written to a temporary file and renamed)"
    return _writable_dir(real.parent)


def _dir_destination(path: Path) -> str | None:
    """An output folder: made if missing, as an output file is, but in a folder that exists
    (the rule for --output-file's folder too: no parents are made)."""
    if path.exists():
        return "is not a directory" if not path.is_dir() else _writable_dir(path)
    return _writable_dir(Path(os.path.realpath(path)).parent)


def _writable_dir(folder: Path) -> str | None:
    """Whether a file can be made in ``folder``: tried, with a temporary file removed at once
    (permissions alone miss read-only mounts and pseudo filesystems)."""
    if not folder.exists():
        return f"the folder {folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".edge-infer-probe-", dir=folder)
    except OSError as e:
        return f"cannot write in {folder} ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None
