"""What a build left on disk, as tests/test_build_faults.py and tests/test_build_swap.py check
it: every path's bytes, the manifest against the files, what libraries leave in TMPDIR."""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from edgeomni.builder import manifest

MANIFEST = manifest.MANIFEST
# what torch and onnxruntime leave in TMPDIR on every run (a cache dir, a session id file)
LIBRARY_TMP = {f"torchinductor_{getpass.getuser()}", ".ses"}


def snapshot(root: Path, changes: tuple[str, ...] = ()) -> dict[str, object]:
    """Every path under root with its bytes (or link target), but those under `changes`."""
    out: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if any(rel == c or rel.startswith(c + "/") for c in changes):
            continue
        if path.is_symlink():
            out[rel] = f"-> {os.readlink(path)}"
        else:
            out[rel] = path.read_bytes() if path.is_file() else "dir"
    return out


def manifest_matches(eng: Path) -> None:
    """The manifest lists exactly the files in eng, with their sizes and digests."""
    files = manifest.read(eng)
    assert files is not None
    on_disk = {p.relative_to(eng).as_posix() for p in eng.rglob("*") if p.is_file()}
    assert set(files) == on_disk - {MANIFEST}
    assert manifest.changed(eng, files) == [] and manifest.foreign(eng, files) == []

