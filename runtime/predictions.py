"""predictions.json as edge-infer writes it: llm_inference's layout (``{"input_file",
"responses": [...]}``), written atomically, any string the requests held included."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeomni.runtime.requests import SURROGATE


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON so readers see the old file or the whole new one, never a partial one.

    Serialises into a temp file in the same directory (same filesystem, so ``os.replace`` is
    atomic), fsyncs it, renames it over ``path`` and fsyncs the directory. Any failure removes
    the temp file and leaves ``path`` as it was.
    """
    path = Path(os.path.realpath(path))  # through a symlink to its file, as ``>`` writes
    directory = path.parent
    data = json_bytes(obj)  # before the temp file: a value that cannot be written costs nothing
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; keep an existing file's mode, else the usual 0644.
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if hasattr(os, "O_DIRECTORY"):
        # Make the rename itself durable; best effort where directories cannot be opened.
        with contextlib.suppress(OSError):
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def json_bytes(obj: Any) -> bytes:
    """``obj`` as indented JSON in UTF-8, ending in a newline. A lone surrogate (a request's
    text as JSON spelled it, echoed back) is written as its ``\\udc80`` escape, which reads
    back as the same string, where UTF-8 has no way to hold it: one odd string never costs a
    run its outputs."""
    text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def write_predictions(
    path: str | os.PathLike[str],
    entries: Sequence[Mapping[str, Any]],
    input_file: str | os.PathLike[str] | None = None,
) -> None:
    """Write ``{"input_file", "responses": [...]}`` (llm_inference's layout) atomically; entries
    must already be in input order. ``input_file`` is null for a --prompt run."""
    write_json_atomic(path, predictions(entries, input_file))


def predictions(
    entries: Sequence[Mapping[str, Any]], input_file: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """The predictions document, its entries checked to be in input order."""
    last = -1
    for n, entry in enumerate(entries):
        missing = [k for k in ("request_idx", "ok", "error") if k not in entry]
        if missing:
            raise ValueError(f"prediction entry {n} lacks {', '.join(missing)}")
        idx = entry["request_idx"]
        if isinstance(idx, bool) or not isinstance(idx, int) or idx <= last:
            raise ValueError(
                f"prediction entry {n} has request_idx {idx!r}; entries must be in input order"
            )
        last = idx
    source = None if input_file is None else str(input_file)
    return {"input_file": source, "responses": [dict(e) for e in entries]}
