"""What a stage's artifact folder must hold for its runner to open it.

Each runner declares an ``Artifact``: the keys its config.json must have, the tables and
tokenizer beside it. ``check_folder`` reads only those small files (and the engine file's
existence, never the engine), so ``edge-infer --validate-config`` can say what is missing before
anything loads; runners open their folder through it too, so a run stops with the same message
instead of a KeyError half-way into loading.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG = "config.json"


class ArtifactError(ValueError):
    """A stage folder cannot be opened: what is wrong, and the file it is wrong in."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = str(path)
        self.message = message

    def __reduce__(self):  # picklable despite the 2-arg __init__
        return (type(self), (self.path, self.message))


Tables = Callable[[Mapping[str, Any]], Mapping[str, Sequence[str]]]
# what a missing key most likely means, said with it
HINTS = {"state": "an engine built before edgeomni declared its row state: rebuild it "
                  "with edge-build"}  # fmt: skip


@dataclass(frozen=True)
class Artifact:
    """A runner's needs: config.json ``keys`` ("a.b" for a key of an object), ``tables``
    (safetensors file -> tensor names; a function of the config where the names depend on it),
    and whether it reads ``tokenizer.json`` (and the chat template beside it)."""

    keys: tuple[str, ...]
    tables: Mapping[str, Sequence[str]] | Tables = field(default_factory=dict)
    tokenizer: bool = False
    component: str | None = None  # the config's "component" must be this, when given


@dataclass
class Checked:
    """A folder that passed ``check_folder``: its config, and its tokenizer when it has one."""

    folder: Path
    config: dict[str, Any]
    tokenizer: Any = None  # runtime.tokenizer.TextTokenizer


def read_json(path: Path) -> Any:
    """A JSON file, or an ArtifactError that says why it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArtifactError(path, "missing") from None
    except IsADirectoryError:
        raise ArtifactError(path, "is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(path, f"cannot be read ({e})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ArtifactError(
            path, f"not valid JSON (line {e.lineno} column {e.colno}: {e.msg})"
        ) from None


def _lookup(config: Mapping[str, Any], dotted: str) -> bool:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return node is not None


def require_keys(
    path: Path, config: Any, keys: Sequence[str], *, within: str | None = None
) -> None:
    """Every key of ``keys`` ("a.b": key b of object a) is in ``config``, read from ``path``
    (``within``: the key ``config`` was found under, for the message)."""
    prefix = f"{within}." if within else ""
    if not isinstance(config, Mapping):
        raise ArtifactError(path, f"{within or 'the file'} must be a JSON object")
    missing = [f"{prefix}{k}" for k in keys if not _lookup(config, k)]
    if missing:
        hint = "".join(f"; {HINTS[k]}" for k in missing if k in HINTS)
        raise ArtifactError(path, f"missing {', '.join(repr(k) for k in missing)}{hint}")


def check_folder(folder: Path, artifact: Artifact) -> Checked:
    """Check what ``artifact`` says ``folder`` holds; raise ArtifactError at the first fault."""
    from edgeomni.runtime import safetensors_np
    from edgeomni.runtime.engine import EngineError, check_engine

    if not folder.is_dir():
        raise ArtifactError(folder, "the stage folder does not exist")
    path = folder / CONFIG
    config = read_json(path)
    if not isinstance(config, dict):
        raise ArtifactError(path, f"must be a JSON object, not {type(config).__name__}")
    require_keys(path, config, ("engine", "backend", *artifact.keys))
    if artifact.component is not None and config.get("component") != artifact.component:
        raise ArtifactError(
            path, f"is for {config.get('component')!r}, not the {artifact.component} engine"
        )
    try:
        check_engine(folder, config)
    except EngineError as e:
        raise ArtifactError(path, str(e)) from None
    tables = artifact.tables(config) if callable(artifact.tables) else artifact.tables
    for name, tensors in tables.items():
        try:
            header = safetensors_np.header(folder / name)
        except FileNotFoundError:
            raise ArtifactError(folder / name, "missing") from None
        except (OSError, ValueError) as e:
            raise ArtifactError(folder / name, f"not a readable safetensors file ({e})") from None
        absent = [t for t in tensors if t not in header]
        if absent:
            shown = ", ".join(absent[:5]) + (
                f" and {len(absent) - 5} more" if len(absent) > 5 else ""
            )
            raise ArtifactError(folder / name, f"has no tensor {shown}")
    checked = Checked(folder, config)
    if artifact.tokenizer:
        from edgeomni.runtime.tokenizer import TextTokenizer

        checked.tokenizer = TextTokenizer(folder)
    return checked
