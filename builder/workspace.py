"""Where one build works, beside its engine dir, and what it may replace there.

A build works in ``.{name}.edge-build-{pid}/`` beside the engine dir ``name``::

    lock        flock'd for the whole build: a workspace whose lock can be taken is stale
    staging/    the new engine dir
    work/       the export's scratch files (raw ONNX)
    previous/   during the swap: the engine dir being replaced

The swap renames the engine dir to previous/ and staging/ to the engine dir, then removes the
workspace, with SIGINT and SIGTERM held, so only SIGKILL or power loss can split it; the next
build of the same engine dir then puts previous/ back if the engine dir is gone, and removes the
workspace. An engine dir is replaced only when it holds nothing but the files its
edgeomni_manifest.json lists, unchanged (builder/manifest.py).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgeomni.builder import interrupts, manifest
from edgeomni.builder.errors import BuildError
from edgeomni.export.common.artifacts import FORMAT as ENGINE_FORMAT
from edgeomni.graph_schema import GRAPH_FILENAME as GRAPH_FILE

SHOWN = 10  # paths a refusal lists before "and N more"
log = logging.getLogger("edge-build")


@dataclass
class Workspace:
    engine_dir: Path
    path: Path
    lock: int | None  # the open lock file's descriptor, flock'd; None once removed

    @property
    def staging(self) -> Path:
        return self.path / "staging"

    @property
    def work(self) -> Path:
        return self.path / "work"

    @property
    def previous(self) -> Path:
        return self.path / "previous"

    def commit(self) -> None:
        """Check the engine dir again (a long build gives a user time to add files), swap the
        new build in and remove the workspace; a signal meanwhile waits and is then dropped."""
        check_engine_dir(self.engine_dir)
        with interrupts.held() as arrived:
            interrupts.check()
            try:
                self._swap()
            except OSError as e:
                where = self.engine_dir
                raise BuildError(f"cannot put the new build in place at {where}: {e}") from None
            self.remove()
        if arrived:
            log.info("interrupted while the new build was being put in place; it is in place")

    def _swap(self) -> None:
        replacing = os.path.lexists(self.engine_dir)
        if replacing:
            os.rename(self.engine_dir, self.previous)
        try:
            os.rename(self.staging, self.engine_dir)
        except OSError:
            if replacing:
                os.rename(self.previous, self.engine_dir)
            raise

    def remove(self) -> None:
        """Remove the workspace and release its lock (once); never a previous build it holds."""
        if self.lock is None:
            return
        try:
            remove_workspace(self.path, self.engine_dir)
        finally:
            os.close(self.lock)
            self.lock = None


@contextmanager
def workspace(engine_dir: Path) -> Iterator[Workspace]:
    """Clean stale workspaces, check the engine dir, and make this build's workspace; it is
    removed at the end whatever happens, with SIGINT and SIGTERM held so none cuts that short."""
    clean_stale(engine_dir)
    check_engine_dir(engine_dir)
    ws = _create(engine_dir)
    try:
        yield ws
    finally:
        with interrupts.held():
            ws.remove()


def prefix(engine_dir: Path) -> str:
    return f".{engine_dir.name}.edge-build-"


def _create(engine_dir: Path) -> Workspace:
    parent = engine_dir.parent
    blocker = next((p for p in (parent, *parent.parents) if os.path.lexists(p)), None)
    if blocker is not None and not blocker.is_dir():
        raise BuildError(f"--engine-dir {engine_dir}: {blocker} is not a directory")
    path = parent / f"{prefix(engine_dir)}{os.getpid()}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except OSError as e:
        raise BuildError(f"--engine-dir {engine_dir}: cannot write in {parent}: {e}") from None
    try:
        lock = os.open(path / "lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)
        (path / "staging").mkdir()
        (path / "work").mkdir()
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return Workspace(engine_dir, path, lock)


def remove_workspace(path: Path, engine_dir: Path) -> bool | None:
    """Remove a workspace, after undoing a swap that a kill split (previous/ and staging/ both
    still there): previous/ goes back to the engine dir. Returns True when it put a previous
    build back, False when there was none to put back, None when it kept the workspace: the
    engine dir exists again, so previous/ has nowhere to go and is not deleted."""
    previous = path / "previous"
    split = previous.is_dir() and (path / "staging").is_dir()
    if split and os.path.lexists(engine_dir):
        log.warning(
            "%s holds the build that was in %s before a swap was cut short, and %s exists "
            "again: kept it (move %s back, or remove it)", path, engine_dir, engine_dir, previous
        )  # fmt: skip
        return None
    if split:
        previous.rename(engine_dir)  # when this fails, nothing is removed
    shutil.rmtree(path, ignore_errors=True)
    return split


def clean_stale(engine_dir: Path) -> None:
    """Remove the workspaces of this engine dir whose build is dead (their lock is free), and
    point at leftovers of the previous edge-build, which had no lock to tell a live one by."""
    for path in _siblings(engine_dir, prefix(engine_dir)):
        pid = path.name[len(prefix(engine_dir)) :]
        ours = pid.isdigit() and path.is_dir() and not path.is_symlink()
        lock = _take_lock(path, int(pid)) if ours else None
        if lock is None:
            continue
        try:
            restored = remove_workspace(path, engine_dir)
        finally:
            os.close(lock)
        if restored is not None:
            back = f"; put its previous build back into {engine_dir}" if restored else ""
            log.info("removed %s, left by a build that did not finish%s", path, back)
    for old in ("partial-", "old-"):
        for path in _siblings(engine_dir, f".{engine_dir.name}.{old}"):
            log.warning(
                "%s was left by an older edge-build; remove it if no edge-build is running", path
            )


def _siblings(engine_dir: Path, start: str) -> list[Path]:
    try:
        names = os.listdir(engine_dir.parent)
    except OSError:
        return []
    return sorted(engine_dir.parent / n for n in names if n.startswith(start))


def _take_lock(path: Path, pid: int) -> int | None:
    """The workspace's lock, taken (an open descriptor), when no live build holds it, else None.
    A workspace without its lock file is being made right now, unless its pid is gone."""
    lock_file = path / "lock"
    if not lock_file.exists() and _alive(pid):
        return None
    try:
        lock = os.open(lock_file, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return None
    return lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True


def check_engine_dir(path: Path) -> None:
    """Refuse an engine dir that holds anything edge-build did not write, or changed since."""
    try:
        problem = _problem(path)
    except OSError as e:
        raise BuildError(f"--engine-dir {path} cannot be read: {e}") from None
    if problem:
        raise BuildError(problem)


def _problem(path: Path) -> str | None:
    if not os.path.lexists(path):
        return None
    if not path.is_dir():
        return f"--engine-dir {path} exists and is not a directory"
    try:
        files = manifest.read(path)
    except manifest.ManifestError as e:
        return _cannot_tell(path, f"has an {manifest.MANIFEST} that {e}")
    if files is None:
        return _without_manifest(path)
    parts = []
    if foreign := manifest.foreign(path, files):
        parts.append(f"files edge-build did not write: {listing(foreign)}")
    if changed := manifest.changed(path, files):
        parts.append(f"files changed since edge-build wrote them: {listing(changed)}")
    if not parts:
        return None
    return f"--engine-dir {path} holds {'; and '.join(parts)}; {MOVE_THEM}"


MOVE_THEM = "move them out or choose another --engine-dir"


def _without_manifest(path: Path) -> str | None:
    top = manifest.foreign(path, {})
    if not top:
        return None
    if looks_like_old_build(path):
        why = f"looks like a build by an older edgeomni (it has no {manifest.MANIFEST})"
        return _cannot_tell(path, why)
    return f"--engine-dir {path} holds files edge-build did not write: {listing(top)}; {MOVE_THEM}"


def _cannot_tell(path: Path, why: str) -> str:
    return (
        f"--engine-dir {path} {why}, so edge-build cannot tell its files from yours "
        f"({listing(manifest.foreign(path, {}))}) and replaces none of them: delete the "
        "directory or choose another --engine-dir"
    )


def looks_like_old_build(path: Path) -> bool:
    """A graph file, or an engine config.json of edgeomni's, with no manifest."""
    if (path / GRAPH_FILE).is_file():
        return True
    try:
        cfg = json.loads((path / "config.json").read_text())
        return str(cfg.get("format", "")).split("/")[0] == ENGINE_FORMAT.split("/")[0]
    except (OSError, ValueError, AttributeError):
        return False


def listing(paths: Sequence[str]) -> str:
    more = len(paths) - SHOWN
    return ", ".join(paths[:SHOWN]) + (f", and {more} more" if more > 0 else "")
