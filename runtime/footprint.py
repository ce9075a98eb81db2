"""What each built component holds, read from the engine dir: edge-infer --dump-profile's
``memory`` section, the built counterpart of edge-build --estimate (same columns, same rules:
engine files as stored, host tables, the KV cache at the build's limits)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeomni.graph_schema import GraphError
from edgeomni.graph_schema.state import parse_state

ENGINE_SUFFIXES = (".onnx", ".data", ".engine", ".fused.safetensors")  # the last: fused weights


def footprint(engine_dir: Path) -> dict[str, dict[str, Any]]:
    """folder (relative to ``engine_dir``) -> component, engine_bytes, table_bytes,
    kv_cache_bytes (None: no KV cache, or a build that did not record its limits), total_bytes;
    for every folder whose config.json names a component."""
    out: dict[str, dict[str, Any]] = {}
    engine_dir = Path(engine_dir)
    for config in sorted(engine_dir.rglob("config.json")):
        try:
            cfg = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(cfg, dict) or not isinstance(cfg.get("component"), str):
            continue
        folder = config.parent
        files = [p for p in folder.iterdir() if p.is_file()]
        engine = sum(p.stat().st_size for p in files if p.name.endswith(ENGINE_SUFFIXES))
        tables = sum(p.stat().st_size for p in files
                     if p.suffix == ".safetensors" and not p.name.endswith(ENGINE_SUFFIXES))  # fmt: skip
        kv = kv_cache_bytes(cfg)
        out[folder.relative_to(engine_dir).as_posix()] = {
            "component": cfg["component"],
            "engine_bytes": engine,
            "table_bytes": tables,
            "kv_cache_bytes": kv,
            "total_bytes": engine + tables + (kv or 0),
        }
    return out


def kv_cache_bytes(cfg: dict[str, Any]) -> int | None:
    """The declared row state (graph_schema.state: KV, recurrent, convolution) of max batch
    rows, a KV row at the build's capacity; None for a component that declares none or a
    build that did not record its limits."""
    limits = cfg.get("builder_config") or {}
    if not limits or not cfg.get("state"):
        return None
    try:
        state = parse_state(cfg["state"])
    except GraphError:
        return None  # named where the component is opened
    capacity = int(limits["max_kv_cache_capacity"])
    return int(limits["max_batch_size"]) * sum(t.row_bytes(capacity) for t in state)
