"""The design card's rules, checked: lean runtime, pure graph_schema, packaging that matches disk."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
TOP = ("graph_schema", "export", "plugins", "builder", "runtime")


def imported_modules(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_graph_schema_is_standard_library_only() -> None:
    foreign = imported_modules(ROOT / "graph_schema") - set(sys.stdlib_module_names) - {"edgeomni"}
    assert foreign == set()


def test_runtime_never_imports_torch_or_transformers() -> None:
    assert {"torch", "transformers", "onnx", "onnxscript"} & imported_modules(
        ROOT / "runtime"
    ) == set()
    code = (
        "import importlib, pkgutil, sys, edgeomni.runtime as r;"
        "mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(r.__path__, 'edgeomni.runtime.')];"
        "assert len(mods) >= 15, len(mods);"
        "bad = [m for m in ('torch', 'transformers', 'onnx') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lower_layers_do_not_import_higher_ones() -> None:
    order = ["graph_schema", "plugins", "export", "builder", "runtime"]
    for i, layer in enumerate(order):
        for path in (ROOT / layer).rglob("*.py"):
            text = path.read_text()
            for higher in order[i + 1 :]:
                assert f"edgeomni.{higher}" not in text, f"{path} imports edgeomni.{higher}"


def test_packages_list_matches_folders() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    on_disk = {
        "edgeomni." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in TOP
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert listed == on_disk
    assert set(cfg["package-dir"]) == {f"edgeomni.{t}" for t in TOP}
