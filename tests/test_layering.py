"""The design card's rules, checked: lean runtime, pure graph_schema, packaging that matches disk."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
TOP = ("graph_schema", "export", "plugins", "builder", "runtime")


def imported_modules(folder: Path) -> set[str]:
    return set().union(*(imported_modules_of(path) for path in folder.rglob("*.py")))


def in_fresh_python(*statements: str) -> None:
    """Run the statements in a new interpreter, so sys.modules holds only what they import."""
    subprocess.run([sys.executable, "-c", ";".join(statements)], check=True)


def test_graph_schema_is_standard_library_only() -> None:
    foreign = imported_modules(ROOT / "graph_schema") - set(sys.stdlib_module_names) - {"edgeomni"}
    assert foreign == set()


def test_runtime_never_imports_torch_or_transformers() -> None:
    assert {"torch", "transformers", "onnx", "onnxscript"} & imported_modules(
        ROOT / "runtime"
    ) == set()
    in_fresh_python(
        "import importlib, pkgutil, sys, edgeomni.runtime as r",
        "mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(r.__path__, 'edgeomni.runtime.')]",
        "assert len(mods) >= 15, len(mods)",
        "bad = [m for m in ('torch', 'transformers', 'onnx') if m in sys.modules]",
        "assert not bad, bad",
    )


def test_only_the_ray_front_imports_ray() -> None:
    """Ray is an optional extra: edge-serve's --ray front (serve/ray_app.py, and serve/cli.py
    checking it is installed) imports it, inside functions, and importing every runtime
    module loads none of it."""
    users = [p.relative_to(ROOT).as_posix() for p in (ROOT / "runtime").rglob("*.py")
             if "ray" in imported_modules_of(p)]  # fmt: skip
    assert sorted(users) == ["runtime/serve/cli.py", "runtime/serve/ray_app.py"]
    in_fresh_python(
        "import importlib, pkgutil, sys, edgeomni.runtime as r",
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(r.__path__, 'edgeomni.runtime.')]",
        "assert 'ray' not in sys.modules",
    )


def imported_modules_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


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


def generic_runtime_files() -> list[Path]:
    """The runtime's files outside runtime/families/: what every family's graph shares."""
    runtime = ROOT / "runtime"
    return sorted(
        p for p in runtime.rglob("*.py") if "families" not in p.relative_to(runtime).parts
    )


def test_generic_runtime_files_name_no_family() -> None:
    """No family's name or module in the generic runtime (runtime/*.py, runtime/runners/): a
    family's code is found through the tables of runtime/families/, which alone import it."""
    families = [
        p.name for p in (ROOT / "runtime" / "families").iterdir() if (p / "__init__.py").is_file()
    ]
    assert "qwen3_omni" in families
    files = generic_runtime_files()
    assert {"prompt.py", "llm.py"} <= {p.name for p in files}
    for path in files:
        text = path.read_text()
        for name in families:  # a whole word: qwen3_tts_inference is a request format's name
            assert not re.search(rf"\b{name}\b", text), f"{path} names the family {name}"
        for node in ast.walk(ast.parse(text)):
            modules = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            for module in modules:
                assert not module.startswith("edgeomni.runtime.families."), (path, module)


def test_no_family_imports_another_familys_folders() -> None:
    """A family is its folders (export/families/<name>/, runtime/families/<name>/): what two
    families share lives in a place neither owns (export/speech/, runtime/speech/), so no
    family's module imports another family's."""
    found = []
    for side in ("export", "runtime"):
        root = ROOT / side / "families"
        for folder in sorted(p for p in root.iterdir() if (p / "__init__.py").is_file()):
            for path in folder.rglob("*.py"):
                for node in ast.walk(ast.parse(path.read_text())):
                    if isinstance(node, ast.Import):
                        modules = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom) and node.module:
                        modules = [node.module]
                    else:
                        continue
                    for module in modules:
                        hit = re.match(r"edgeomni\.(export|runtime)\.families\.(\w+)", module)
                        if hit and hit.group(2) != folder.name:
                            found.append(f"{path.relative_to(ROOT)} imports {module}")
    assert found == []


def test_families_tables_import_no_family_module() -> None:
    """Importing the tables (and the runner table and text runner built on them) loads none of
    a family's modules: only the family packages, whose __init__ declares "module:attr"
    strings."""
    in_fresh_python(
        "import sys, edgeomni.runtime.families as f, edgeomni.runtime.runners.llm",
        "packages = {f'edgeomni.runtime.families.{name}' for name in f.PACKAGES}",
        "loaded = sorted(m for m in sys.modules if m.startswith('edgeomni.runtime.families.') and m not in packages)",
        "assert not loaded, loaded",
        "assert f.MEDIA['qwen3_omni_moe'] == 'edgeomni.runtime.families.qwen3_omni.media:MediaEncoders'",
    )


def test_media_hooks_load() -> None:
    """Every declared media hook imports and has what runtime/prompt.py says a hook has; a model
    type that declares none reads text only."""
    from edgeomni.runtime.families import MEDIA
    from edgeomni.runtime.families.qwen3_omni.media import MediaEncoders
    from edgeomni.runtime.prompt import TextOnly, media_hook
    from edgeomni.runtime.stage import load_factory

    assert media_hook({"model_type": "qwen3_omni_moe"}) is MediaEncoders
    for model_type, factory in MEDIA.items():
        hook = load_factory(factory)
        assert media_hook({"model_type": model_type}) is hook
        assert all(callable(getattr(hook, name, None)) for name in ("check", "require", "expand"))
    assert media_hook({"model_type": "qwen3"}) is TextOnly and media_hook({}) is TextOnly


def of_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def private_names(path: Path, cls: str) -> set[str]:
    """The underscored (not dunder) names class ``cls`` of ``path`` defines: its methods and
    the attributes its methods set on ``self``."""
    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    names = set()
    for node in ast.walk(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and of_self(node):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(tree: ast.AST, names: set[str], *, on_self: bool) -> set[str]:
    """Which of ``names`` ``tree`` reads as attributes (``on_self``: on ``self`` too)."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in names and (on_self or not of_self(node))
    }


def test_the_serving_fronts_use_only_public_names_of_pipeline_and_server() -> None:
    """Server and the Ray relay share Pipeline's public intake (admit, prepare, slot_stage,
    width): no runtime module but pipeline.py reaches into a Pipeline's underscored names; and
    RayServer uses Server's public names only (on_event, on_done; it overrides enter)."""
    runtime = ROOT / "runtime"
    pipeline = private_names(runtime / "pipeline.py", "Pipeline")
    assert {"_runners", "_as_read"} <= pipeline
    for path in runtime.rglob("*.py"):
        if path.name != "pipeline.py":
            used = private_uses(ast.parse(path.read_text()), pipeline, on_self=False)
            assert not used, f"{path.relative_to(ROOT)} uses Pipeline's {sorted(used)}"
    server = private_names(runtime / "serve" / "server.py", "Server")
    ray = runtime / "serve" / "ray_app.py"
    assert {"_pending", "_arrivals"} <= server
    body = next(n for n in ast.parse(ray.read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == "RayServer")  # fmt: skip
    used = private_uses(body, server - private_names(ray, "RayServer"), on_self=True)
    assert not used, f"RayServer uses Server's {sorted(used)}"


ENGINE_MODULES = ("engine", "engine_api", "fused_engine", "tensorrt_engine", "buffers", "memory")


def test_no_import_cycle_among_the_engine_modules() -> None:
    """The backends (engine.py's ONNX Runtime, fused_engine.py, tensorrt_engine.py) import what
    they share from engine_api.py, never each other, at module level or inside a function:
    engine.py opens them through the backend table (plugins/backends.py)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from import_layers import arrows

    graph = arrows("runtime")
    names = {f"edgeomni.runtime.{m}" for m in ENGINE_MODULES} & set(graph)
    assert len(names) >= 5, names

    def reach(a: str, seen: set[str]) -> set[str]:
        for b in graph[a]:
            if b in names and b not in seen:
                seen.add(b)
                reach(b, seen)
        return seen

    cycles = sorted(a for a in names if a in reach(a, set()))
    assert not cycles, cycles


def test_only_the_engines_read_cuda_graphs() -> None:
    """Whether an engine captures CUDA graphs stays behind it: callers ask it for a graph id
    (None where it captures nothing) or ask Engines whether a config's engine captures."""
    # engine_api.py: the engines' shared base (EngineBase.new_graph_id)
    engines = {"engine.py", "engine_api.py", "fused_engine.py", "tensorrt_engine.py"}
    readers = []
    for path in (ROOT / "runtime").rglob("*.py"):
        if path.name in engines:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            read = isinstance(node, ast.Attribute) and node.attr == "cuda_graphs"
            if isinstance(node, ast.Call):  # getattr(engine, "cuda_graphs"), open_engine(...)
                func, args = ast.unparse(node.func), [ast.unparse(a) for a in node.args]
                read |= func == "getattr" and args[1:2] == ["'cuda_graphs'"]
                read |= "open_engine" in func and any(k.arg == "cuda_graphs" for k in node.keywords)
            if read:
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not readers, readers


def test_the_backend_table_names_what_builds_opens_and_checks() -> None:
    """Every backend's build, engine and file check resolve, and edge-build's --backend takes
    exactly the table's names."""
    from edgeomni.builder import cli as build_cli
    from edgeomni.plugins.backends import BACKENDS, load

    for backend in BACKENDS.values():
        refs = (backend.build, backend.open, backend.check)
        assert all(callable(load(ref)) for ref in refs if ref), refs
    action = next(a for a in build_cli.parser()._actions if a.dest == "backend")
    assert tuple(action.choices) == tuple(BACKENDS)
    assert all(name in action.help for name in BACKENDS)
