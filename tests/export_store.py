"""Raw ONNX exports kept for the session, so a build that differs from an earlier one only after
the export (its lowering, its backend, a component subset, sizes the export does not read)
does not run torch.onnx.export again.

Each family's ``export_component(ckpt, component, work_dir, args)`` is the slow step of a build
(seconds per component of a tiny checkpoint; the lowering and the ONNX Runtime build after it
take a fraction of a second). Its result depends on the checkpoint's files, the component, and
the fields of ``args`` it reads: the store runs the real export with ``args`` behind a proxy
that records each field read, and hands the same files back only to a later call with the same
checkpoint files (paths, sizes, mtimes), the same family and component, and equal values for
every field the first call read. Every distinct export still runs once per session; what is
reused is byte for byte what that export wrote.

Only builds that opt in (``ExportStore.build`` or ``reused()``: the session's engines and tests
whose subject comes after the export) use it; a test of the export itself, of a build's
determinism, or one that patches what an export reads, calls the exporter as it is.

``ExportStore.build`` also runs a build's exports on both cores: while the build exports its
components in order, a second process (spawned once per session) exports them from the last
backwards, and the build takes each one the other process has started instead of exporting it
again. An export is a single-threaded trace; the files are the same whichever process wrote
them (tests/test_export_store.py checks it).
"""

from __future__ import annotations

import multiprocessing
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

Exporter = Callable[[Any, Any, Path, Any], Path]


class _Reads:
    """``args`` as the export sees it, noting every field the export reads (in ``_fields``)."""

    def __init__(self, args: Any) -> None:
        object.__setattr__(self, "_args", args)
        object.__setattr__(self, "_fields", {})

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._args, name)
        self._fields[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"BuildArgs is frozen: cannot set {name}")


@dataclass(frozen=True)
class _Entry:
    where: tuple[Any, ...]  # the exporter's module, the component, the checkpoint's files
    read: dict[str, Any]  # the args fields the export read, with their values
    folder: Path  # a copy of the export's work dir
    model: Path  # the model path it returned, relative to its work dir


def fingerprint(ckpt_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """Every file under the checkpoint dir: (relative path, size, mtime in ns)."""
    root = Path(ckpt_dir).resolve()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return tuple((p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                 for p in files)  # fmt: skip


class ExportStore:
    """Exports kept under ``root`` (a folder each), matched as the module docstring says."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries: list[_Entry] = []
        self.reuses = 0  # exports handed back without running here (for the tests of the store)
        self._active = False
        self._folders = 0
        self._pool: ProcessPoolExecutor | None = None
        # exports for the second process, in its order; one at a time goes to it, so that an
        # export not started yet can still be taken back (the pool queues ahead of its worker)
        self._lock = threading.RLock()
        self._planned: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []  # (where, call)
        self._started: dict[tuple[Any, ...], tuple[Path, Future]] = {}
        self._busy = False

    def export(self, real: Exporter, ckpt: Any, component: Any, work_dir: Path, args: Any) -> Path:
        """``real(ckpt, component, work_dir, args)``, or the files of an equal earlier call (or
        of the same export the second process has started)."""
        where = _where(real, component, Path(ckpt.path))
        with self._lock:  # not started by the second process: exported here
            self._planned = [(w, call) for w, call in self._planned if w != where]
            started = self._started.pop(where, None)
        if started is not None:  # started there: its files, once it is done
            folder, future = started
            try:
                read, model = future.result()
            except Exception:  # exported here instead, where an error is the test's
                pass
            else:
                self.entries.append(_Entry(where, read, folder, Path(model)))
        entry = self._match(where, args)
        if entry is not None:
            shutil.copytree(entry.folder, work_dir, dirs_exist_ok=True)
            self.reuses += 1
            return work_dir / entry.model
        reads = _Reads(args)
        model = Path(real(ckpt, component, work_dir, reads))
        folder = self._folder()
        shutil.copytree(work_dir, folder)
        self.entries.append(_Entry(where, dict(reads._fields), folder, model.relative_to(work_dir)))
        return model

    def build(
        self, model_dir: Path, engine_dir: Path, args: Any, components: Sequence[str] | None = None
    ) -> Path | None:
        """builder.build with its exports through the store and on both cores (prefetch)."""
        from edgeomni.builder.build import build

        self.prefetch(model_dir, args, components)
        with self.reused():
            return build(model_dir, engine_dir, args, components)

    def prefetch(
        self, model_dir: Path, args: Any, components: Sequence[str] | None = None
    ) -> None:
        """Plan the second process's share of a build's exports: the selected components after
        the first, last first, but those the store has. A build inside reused() takes them."""
        from edgeomni.builder.build import select_components
        from edgeomni.export.common.checkpoint import open_checkpoint
        from edgeomni.export.registry import family_for

        ckpt = open_checkpoint(Path(model_dir))
        hooks = family_for(ckpt.model_type).hooks()
        real = getattr(hooks.export_component, "__wrapped__", hooks.export_component)
        selected = select_components(hooks.components(ckpt), components)
        for comp in reversed(selected[1:]):
            where = _where(real, comp, Path(model_dir))
            if self._match(where, args) is None:
                call = (str(model_dir), comp.name, args)
                with self._lock:
                    self._planned.append((where, call))
        self._next()

    def component(self, ckpt_dir: Path, name: str, work_dir: Path, args: Any) -> Path:
        """The raw ONNX of one component of a checkpoint, exported as edge-build's export step
        does it (the family's export_component), through the store."""
        from edgeomni.export.common.checkpoint import open_checkpoint
        from edgeomni.export.registry import family_for

        ckpt = open_checkpoint(Path(ckpt_dir))
        hooks = family_for(ckpt.model_type).hooks()
        (comp,) = [c for c in hooks.components(ckpt) if c.name == name]
        real = getattr(hooks.export_component, "__wrapped__", hooks.export_component)
        return self.export(real, ckpt, comp, work_dir, args)

    def close(self) -> None:
        """Stop the second process (exports it has not started are dropped)."""
        with self._lock:
            self._planned.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._started.clear()

    def _next(self, done: Future | None = None) -> None:
        """Hand the second process its next planned export, if it is idle (``done``: the one
        it has just finished; this runs in the pool's thread then)."""
        with self._lock:
            if done is not None:
                self._busy = False
            if self._busy or not self._planned or (done is not None and self._pool is None):
                return
            where, (ckpt_dir, component, args) = self._planned.pop(0)
            folder = self._folder()
            try:
                future = self.worker().submit(export_in_worker, ckpt_dir, component,
                                               str(folder), args)  # fmt: skip
            except Exception:  # a broken pool: this process exports everything
                self._planned.clear()
                self._pool = None
                return
            self._started[where] = (folder, future)
            self._busy = True
        future.add_done_callback(self._next)

    def _match(self, where: tuple[Any, ...], args: Any) -> _Entry | None:
        for entry in self.entries:
            if entry.where == where and all(getattr(args, k) == v for k, v in entry.read.items()):
                return entry
        return None

    def _folder(self) -> Path:
        with self._lock:
            self._folders += 1
            return self.root / str(self._folders)

    def worker(self) -> ProcessPoolExecutor:
        """The second process (a pool of one), started on first use."""
        if self._pool is None:  # spawned: a fresh interpreter, none of this process's patches
            self._pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"),
                                             initializer=_worker_init)  # fmt: skip
        return self._pool

    def _through(self, real: Exporter) -> Exporter:
        def export_component(ckpt: Any, comp: Any, work_dir: Path, args: Any) -> Path:
            return self.export(real, ckpt, comp, work_dir, args)

        export_component.__wrapped__ = real  # type: ignore[attr-defined]
        return export_component

    @contextmanager
    def reused(self) -> Iterator[None]:
        """Builds inside go through the store: every registered family's export_component."""
        if self._active:  # a fixture built inside another reuse: already patched
            yield
            return
        from edgeomni.export.registry import families

        with pytest.MonkeyPatch.context() as m:
            for family in families():
                hooks = family.hooks()
                real = hooks.export_component
                m.setattr(hooks, "export_component", self._through(real))
            self._active = True
            try:
                yield
            finally:
                self._active = False


def _where(real: Exporter, component: Any, ckpt_dir: Path) -> tuple[Any, ...]:
    """What an export is of: the exporter, the component, the checkpoint and its files."""
    return (real.__module__, real.__qualname__, component, str(ckpt_dir.resolve()),
            fingerprint(ckpt_dir))  # fmt: skip


def _worker_init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the session's to handle


def export_in_worker(
    ckpt_dir: str, component: str, folder: str, args: Any
) -> tuple[dict[str, Any], str]:
    """In the second process: the export (the family's export_component: a fresh interpreter
    has none of this one's patches), into ``folder``; (the args fields it read, the model path
    relative to the folder)."""
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.registry import family_for

    ckpt = open_checkpoint(Path(ckpt_dir))
    hooks = family_for(ckpt.model_type).hooks()
    real = hooks.export_component
    (comp,) = [c for c in hooks.components(ckpt) if c.name == component]
    reads = _Reads(args)
    model = Path(real(ckpt, comp, Path(folder), reads))
    return dict(reads._fields), model.relative_to(folder).as_posix()
