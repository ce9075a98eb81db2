"""The session's store of raw exports (tests/export_store.py) hands back an export only to a call
with the same checkpoint files, family and component and equal values of every args field the
first call read; an export made in its second process is the one made here; and a build through
it is byte for byte the build without it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from export_store import Exporter, ExportStore, export_in_worker


@dataclass(frozen=True)
class Args:
    dtype: str = "float32"
    logits_topk: int = 0
    max_batch_size: int = 1


@dataclass
class Ckpt:
    path: Path


def exporter(calls: list[str]) -> Exporter:
    """A fake export_component: writes model.onnx (and a data file) from what it read."""

    def export_component(ckpt: Ckpt, component: str, work_dir: Path, args: Args) -> Path:
        calls.append(component)
        work_dir.mkdir(parents=True, exist_ok=True)
        text = f"{component} {args.dtype} {args.logits_topk} {(ckpt.path / 'w').read_text()}"
        (work_dir / "model.onnx").write_text(text)
        (work_dir / "model.onnx.data").write_text(str(len(calls)))
        return work_dir / "model.onnx"

    return export_component


def test_reuse_only_on_what_the_export_read(tmp_path: Path) -> None:
    ckpt = Ckpt(tmp_path / "ckpt")
    ckpt.path.mkdir()
    (ckpt.path / "w").write_text("weights")
    calls: list[str] = []
    store, real = ExportStore(tmp_path / "store"), exporter(calls)

    def export(work: str, component: str = "llm", **args: object) -> Path:
        return store.export(real, ckpt, component, tmp_path / work, Args(**args))

    first = export("a")
    assert (len(calls), store.reuses) == (1, 0)
    again = export("b", max_batch_size=8)  # a field the export does not read
    assert (len(calls), store.reuses) == (1, 1)
    assert again == tmp_path / "b" / "model.onnx"
    assert again.read_text() == first.read_text() and (tmp_path / "b" / "model.onnx.data").exists()
    export("c", logits_topk=8)  # one it reads
    export("d", component="talker")
    assert (len(calls), store.reuses) == (3, 1)
    (ckpt.path / "w").write_text("other weights")  # the checkpoint changed
    os.utime(ckpt.path / "w", ns=(1, 1))
    assert "other weights" in export("e").read_text()
    assert (len(calls), store.reuses) == (4, 1)


def test_reused_patches_every_family_and_restores(tmp_path: Path) -> None:
    from edgeomni.export.registry import families

    hooks = [f.hooks() for f in families()]
    before = [h.export_component for h in hooks]
    store = ExportStore(tmp_path)
    with store.reused():
        patched = [h.export_component for h in hooks]
        # == not is: a TextFamily's hook is a bound method, made anew at each lookup
        assert all(p.__wrapped__ == b for p, b in zip(patched, before, strict=True))
        with store.reused():  # nested: patched once
            assert [h.export_component for h in hooks] == patched
    assert [h.export_component for h in hooks] == before


def test_a_build_through_the_store_is_the_build_without_it(
    qwen3_ckpt: Path, qwen3_engine: Path, exports: ExportStore, tmp_path: Path
) -> None:
    """Other sizes, so that only the export is shared with the session's engine."""
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    args = BuildArgs(max_batch_size=2, max_input_len=32, max_kv_cache_capacity=64)
    reuses = exports.reuses
    with exports.reused():
        assert build(qwen3_ckpt, tmp_path / "reused", args) is not None
    assert exports.reuses == reuses + 1
    assert build(qwen3_ckpt, tmp_path / "fresh", args) is not None

    def files(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip

    reused, fresh = files(tmp_path / "reused"), files(tmp_path / "fresh")
    assert "llm.onnx" in fresh and reused == fresh


def test_an_export_in_the_second_process_is_the_one_made_here(
    qwen3_ckpt: Path, qwen3_engine: Path, exports: ExportStore, tmp_path: Path
) -> None:
    """The session engine's export (made here, or taken from the second process) against the
    same export made there now: the same fields read, the same files."""
    from edgeomni.export.family import BuildArgs

    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=128)  # conftest's
    call = (str(qwen3_ckpt), "llm", str(tmp_path), args)
    read, model = exports.worker().submit(export_in_worker, *call).result()
    (entry,) = [e for e in exports.entries if e.where[2].name == "llm"
                and e.where[3] == str(qwen3_ckpt.resolve()) and e.read == read]  # fmt: skip
    assert model == entry.model.as_posix() and "dtype" in read

    def files(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip

    assert files(tmp_path) == files(entry.folder) and files(tmp_path)
