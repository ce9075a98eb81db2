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

Only builds that opt in (``ExportStore.reused()``, the session's engines and tests whose
subject comes after the export) use it; a test of the export itself, of a build's determinism,
or one that patches what an export reads, calls the exporter as it is.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
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
        self.reuses = 0  # exports handed back without running (for the tests of the store)
        self._active = False

    def export(self, real: Exporter, ckpt: Any, component: Any, work_dir: Path, args: Any) -> Path:
        """``real(ckpt, component, work_dir, args)``, or the files of an equal earlier call."""
        where = (real.__module__, real.__qualname__, component, str(Path(ckpt.path).resolve()),
                 fingerprint(ckpt.path))  # fmt: skip
        for entry in self.entries:
            if entry.where == where and all(
                getattr(args, k) == v for k, v in entry.read.items()
            ):
                shutil.copytree(entry.folder, work_dir, dirs_exist_ok=True)
                self.reuses += 1
                return work_dir / entry.model
        reads = _Reads(args)
        model = Path(real(ckpt, component, work_dir, reads))
        folder = self.root / str(len(self.entries))
        shutil.copytree(work_dir, folder)
        self.entries.append(_Entry(where, dict(reads._fields), folder, model.relative_to(work_dir)))
        return model

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
