"""Read a Hugging Face checkpoint directory from disk (never from a hub)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """The checkpoint directory is missing, malformed or unsupported."""


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON object file, or a CheckpointError naming it and what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read ({e})") from None
    except RecursionError:  # the decoder recurses per level
        raise CheckpointError(f"{path}: nested too deeply to read") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


@dataclass
class Checkpoint:
    """config.json, generation_config.json and lazily opened safetensors shards."""

    path: Path
    config: dict[str, Any]
    generation_config: dict[str, Any]
    _weight_files: dict[str, Path] | None = field(default=None, repr=False)
    _handles: dict[Path, Any] = field(default_factory=dict, repr=False)
    _prequantized: Any = field(default=None, repr=False)

    @property
    def quantization(self) -> Any:
        """The checkpoint's own quantization (export/common/prequantized.Scheme), or None."""
        from edgeomni.export.common.prequantized import scheme

        return scheme(self.config)

    @property
    def prequantized(self) -> Any:
        """The readers of a pre-quantized checkpoint (prequantized.Prequantized), or None: they
        serve each quantized linear's ``<stem>.weight`` and keep its int4 form for the builder."""
        if self._prequantized is None and self.quantization is not None:
            from edgeomni.export.common.prequantized import Prequantized

            self._prequantized = Prequantized(
                self.quantization, set(self.weight_files), self.stored_tensor
            )
        return self._prequantized

    @property
    def weight_files(self) -> dict[str, Path]:
        """Tensor name -> shard; read on first use, so a config problem is reported first."""
        if self._weight_files is None:
            self._weight_files = _weight_files(self.path)
        return self._weight_files

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    def has(self, name: str) -> bool:
        pq = self.prequantized
        return name in self.weight_files or (pq is not None and pq.serves(name))

    def tensor(self, name: str) -> Any:
        """One tensor as a torch tensor (loaded on demand, shard files kept open); a quantized
        linear's ``<stem>.weight`` is its dequantized float32 value."""
        pq = self.prequantized
        if pq is not None and pq.serves(name):
            return pq.tensor(name)
        return self.stored_tensor(name)

    def stored_tensor(self, name: str) -> Any:
        """One tensor exactly as the safetensors file holds it."""
        from safetensors import safe_open

        shard = self.weight_files.get(name)
        if shard is None:
            raise CheckpointError(f"{self.path}: weight {name!r} is missing from the checkpoint")
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(shard), framework="pt")
        return self._handles[shard].get_tensor(name)

    def names(self, prefix: str = "") -> Iterable[str]:
        pq = self.prequantized
        extra = pq.virtual() if pq is not None else set()
        return (n for n in [*self.weight_files, *sorted(extra)] if n.startswith(prefix))


def section(cfg: dict[str, Any], *path: str) -> dict[str, Any]:
    """cfg[path[0]][path[1]]... of a nested config.json, with an error naming the missing key."""
    node: Any = cfg
    for i, key in enumerate(path):
        if not isinstance(node, dict) or not isinstance(node.get(key), dict):
            raise CheckpointError(f"config.json: no {'.'.join(path[: i + 1])} section")
        node = node[key]
    return node


def position_limits(
    cfg: dict[str, Any], sections: dict[str, tuple[str, ...]], selected: Iterable[str]
) -> dict[str, tuple[str, int]]:
    """For each selected component named in ``sections`` (component -> path of its config
    section), the section's ``max_position_embeddings`` as (its dotted key, value), where the
    config gives one (a family's ``position_limits`` hook)."""
    out: dict[str, tuple[str, int]] = {}
    for name in selected:
        if name not in sections:
            continue
        node: Any = cfg
        for key in sections[name]:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get("max_position_embeddings") if isinstance(node, dict) else None
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = (".".join((*sections[name], "max_position_embeddings")), value)
    return out


def open_checkpoint(model_dir: str | Path) -> Checkpoint:
    """Open ``model_dir``; every problem is a CheckpointError that says what is wrong."""
    path = Path(model_dir)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{path}: no config.json (is this a Hugging Face checkpoint?)")
    config = read_json(cfg_path)
    if not config.get("model_type"):
        raise CheckpointError(f"{cfg_path}: no model_type")
    gen_path = path / "generation_config.json"
    generation = read_json(gen_path) if gen_path.is_file() else {}
    ckpt = Checkpoint(path, config, generation)
    ckpt.quantization  # noqa: B018 - a quantization_config not read fails here, in one line
    return ckpt


def _weight_files(path: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no weight_map")
        files = {name: path / shard for name, shard in weight_map.items()}
        missing = sorted({str(f) for f in files.values() if not f.is_file()})
        if missing:
            raise CheckpointError(f"{index}: shards missing on disk: {', '.join(missing)}")
        return files
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{path}: no *.safetensors weights (other formats are not read)")
    files: dict[str, Path] = {}
    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt") as f:
                files.update((name, shard) for name in f.keys())  # noqa: SIM118
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{shard}: unreadable safetensors file ({e})") from None
    return files
