"""How runtime/'s modules layer: its import floors and the arrows that run back up.

Every import of an ``edgeomni.runtime`` module by another is an arrow, those inside functions
too (they load later, but the module still needs the other one); imports under
``if TYPE_CHECKING:`` are not (nothing loads them). An arrow a -> b runs back up when b already
reaches a through module-level imports: b sits above a, and only a deferred import keeps the
two from a circle. The floors are the longest chain of the other arrows.

    python bench/import_layers.py [--package runtime]   # prints the floors and the back-arrows
"""

from __future__ import annotations

import argparse
import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules(package: str) -> dict[str, Path]:
    """``edgeomni.<package>``'s modules by dotted name (a package by its own name)."""
    out = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(("edgeomni", *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return out


def arrows(package: str) -> dict[str, dict[str, bool]]:
    """module -> {module it imports: whether at module level}, within the package."""
    known = modules(package)
    graph: dict[str, dict[str, bool]] = {}
    for name, path in known.items():
        out = graph.setdefault(name, {})
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, top in _imports(tree.body, True):
            for target in _targets(node, name, path.name == "__init__.py"):
                # "from package import module" imports the module (and the package, below it)
                subs = [f"{target}.{a.name}" for a in getattr(node, "names", ())]
                for t in [s for s in subs if s in known] or [target]:
                    if t in known and t != name:
                        out[t] = out.get(t, False) or top
    return graph


def _imports(body: list[ast.stmt], top: bool):  # noqa: ANN202 - (node, at module level) pairs
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _imports(node.orelse, top)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, top
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                yield from _imports([child], inner)


def _targets(node: ast.stmt, module: str, package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if not node.level:
        return [node.module or ""]
    base = module.split(".")[: len(module.split(".")) - node.level + package]
    return [".".join(base + ([node.module] if node.module else []))]


def layers(package: str = "runtime") -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Each module's floor (0: imports none of the package's) and the back-arrows."""
    graph = arrows(package)

    @cache
    def reach(a: str) -> frozenset[str]:  # what a loads through module-level imports
        direct = {b for b, top in graph[a].items() if top}
        return frozenset(direct.union(*(reach(b) for b in direct)))

    back = sorted((a, b) for a in graph for b in graph[a] if a in reach(b))

    @cache
    def floor(a: str) -> int:
        up = [b for b in graph[a] if (a, b) not in back]
        return 1 + max(map(floor, up)) if up else 0

    return {m: floor(m) for m in graph}, back


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--package", default="runtime")
    args = p.parse_args()
    floors, back = layers(args.package)
    print(f"{args.package}/: {max(floors.values()) + 1} import floors, {len(back)} back-arrows")
    for a, b in back:
        print(f"  {a.removeprefix('edgeomni.')} (floor {floors[a]}) -> "
              f"{b.removeprefix('edgeomni.')} (floor {floors[b]})")  # fmt: skip


if __name__ == "__main__":
    main()
