"""edgeomni_manifest.json: the files a build wrote, so edge-build can tell its own from a user's.

Only what is listed here (unchanged since it was written) may be replaced by a later build;
anything else in an engine dir is the user's. Files up to HASH_LIMIT carry a sha256 (configs,
templates, tokenizers); larger ones (engines, tables) only their size, so checking stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST = "edgeomni_manifest.json"
FORMAT = "edgeomni.manifest/1"
HASH_LIMIT = 64 * 2**20

Files = dict[str, dict[str, Any]]  # relative posix path -> {"size": n, "sha256": hex (small files)}
Entry = tuple[str, os.DirEntry]


class ManifestError(ValueError):
    """The manifest is there but cannot be read as one (the message says how, after "that")."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def entry(path: Path) -> dict[str, Any]:
    """What the manifest keeps of one file: its size, and its sha256 when it is small."""
    size = path.stat().st_size
    return {"size": size, "sha256": sha256(path)} if size <= HASH_LIMIT else {"size": size}


def walk(
    root: Path, descend: Callable[[str], bool] = lambda rel: True, prefix: str = ""
) -> Iterator[Entry]:
    """Every entry below root as (relative posix path, entry), symlinks not followed; a
    directory is looked into when descend(its path) says so."""
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        rel = prefix + e.name
        yield rel, e
        if e.is_dir(follow_symlinks=False) and descend(rel):
            yield from walk(Path(e.path), descend, rel + "/")


def record(root: Path) -> Files:
    """An entry for every file under root (a staging dir holds only what the build wrote)."""
    return {
        rel: entry(Path(e.path))
        for rel, e in walk(root)
        if e.is_file(follow_symlinks=False) and rel != MANIFEST
    }


def write(root: Path, files: Mapping[str, Mapping[str, Any]]) -> None:
    """Save the manifest atomically: a reader sees the old one or the whole new one."""
    text = json.dumps({"format": FORMAT, "files": dict(sorted(files.items()))}, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{MANIFEST}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, root / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(root: Path) -> Files | None:
    """The manifest's files, or None when there is none; ManifestError when it is not valid."""
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot be read ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ManifestError(f"is not an {FORMAT} file")
    files = data.get("files")
    if not isinstance(files, dict) or not all(_valid(k, v) for k, v in files.items()):
        raise ManifestError("has no valid list of files")
    return files


def _valid(rel: str, info: Any) -> bool:
    """A plain relative path inside the engine dir, with a size: nothing a manifest says may lead
    out of it."""
    path = PurePosixPath(rel)
    inside = str(path) == rel and not path.is_absolute() and ".." not in path.parts
    sized = isinstance(info, dict) and isinstance(info.get("size"), int)
    return inside and sized and rel not in (".", MANIFEST)


def foreign(root: Path, files: Mapping[str, Any]) -> list[str]:
    """Entries under root that are neither manifest files, the manifest, nor directories holding
    manifest files ('name/' for a directory, which is not looked into)."""
    folders = {str(p) for rel in files for p in PurePosixPath(rel).parents} - {"."}
    found = []
    for rel, e in walk(root, descend=lambda rel: rel in folders):
        if e.is_dir(follow_symlinks=False):
            if rel not in folders:
                found.append(rel + "/")
        elif not (e.is_file(follow_symlinks=False) and (rel in files or rel == MANIFEST)):
            found.append(rel)
    return sorted(found)


def changed(root: Path, files: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Manifest files whose size (or sha256, where recorded) differs; missing ones are fine."""
    return sorted(rel for rel, info in files.items() if _differs(root / rel, info))


def _differs(path: Path, info: Mapping[str, Any]) -> bool:
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return False  # gone: nothing of the user's to lose
    if not stat.S_ISREG(st.st_mode):
        return False  # not a plain file any more: foreign() reports it
    if st.st_size != info["size"]:
        return True
    return "sha256" in info and sha256(path) != info["sha256"]


def is_own(root: Path, rel: str) -> bool:
    """Whether root/rel is a file this manifest lists, unchanged (sha256 recorded and equal)."""
    try:
        files = read(root) or {}
    except ManifestError:
        return False
    info = files.get(rel)
    path = root / rel
    ok = info is not None and "sha256" in info and path.is_file() and not path.is_symlink()
    return ok and sha256(path) == info["sha256"]


def add(root: Path, rels: Iterable[str]) -> None:
    """Record these files (written into root) in its manifest, keeping the entries already there;
    a manifest that cannot be read is replaced (its engines then count as the user's)."""
    try:
        files = read(root) or {}
    except ManifestError:
        files = {}
    files.update((rel, entry(root / rel)) for rel in rels)
    write(root, files)
