"""Files the runtime reads beside an engine, written the same way by every family."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.text_files import chat_template, check_text_files

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ENGINE_CONFIG = "config.json"
FORMAT = "edgeomni.engine/1"


def require_tokenizer(ckpt: Checkpoint) -> None:
    """edge-infer needs a fast tokenizer, and opens it and the chat template when the stage
    opens: checked by a family's preflight, before any export (export/common/text_files.py),
    and again where they are copied (a family without preflight)."""
    check_text_files(ckpt)


def write_tokenizer(ckpt: Checkpoint, out_dir: Path) -> None:
    """Copy the fast tokenizer and write chat_template.jinja (the runtime reads only these)."""
    require_tokenizer(ckpt)
    for name in TOKENIZER_FILES:
        if (ckpt.path / name).is_file():
            shutil.copyfile(ckpt.path / name, out_dir / name)
    template, _ = chat_template(ckpt.path)
    if template:
        (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")


def write_embedding(table: Any, out_dir: Path, name: str = "embedding.safetensors") -> None:
    """The token embedding table, float32 [V, H], which the runtime memory-maps."""
    from safetensors.torch import save_file

    save_file({"embedding": table.float().contiguous()}, str(out_dir / name))


def eos_token_ids(ckpt: Checkpoint, *configs: dict[str, Any]) -> list[int]:
    """Union of eos_token_id from the given configs and generation_config.json."""
    ids: list[int] = []
    for cfg in (*configs, ckpt.generation_config):
        value = cfg.get("eos_token_id")
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    return ids


def generation_defaults(ckpt: Checkpoint) -> dict[str, Any]:
    """Sampling defaults the checkpoint ships (generation_config.json), in our key names."""
    gen = ckpt.generation_config
    if gen.get("do_sample") is False:
        return {"top_k": 1}
    keys = ("temperature", "top_k", "top_p", "repetition_penalty")
    return {k: gen[k] for k in keys if isinstance(gen.get(k), (int, float))}


def engine_fields(ckpt: Checkpoint, component: Any, args: Any) -> dict[str, Any]:
    """What every engine config opens with: the component, its model type, its engine file and
    what it was built for (export/family.py's Component and BuildArgs)."""
    return {"component": component.name, "model_type": ckpt.model_type,
            "engine": component.engine, "backend": args.backend, "device": args.device,
            "dtype": args.dtype}  # fmt: skip


def decoder_fields(cfg: Any, dtype: str) -> dict[str, Any]:
    """A decoder's dimensions (export.common.decoder.DecoderConfig) as engine-config keys, and
    the row state it declares (its KV cache in ``dtype``)."""
    from edgeomni.graph_schema.state import kv_tensors

    return {
        "state": [t.describe() for t in kv_tensors(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                 dtype)],
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
    }


def text_engine_config(
    ckpt: Checkpoint, component: Any, args: Any, decoder: Any, config: dict[str, Any]
) -> dict[str, Any]:
    """The config.json of a text decoder the generic text model's runner runs (a Qwen3 llm,
    Qwen3-ASR's): its build, dimensions, end-of-sequence ids (``config``'s and the generation
    config's), pad id, sampling defaults, the shapes each phase binds (a TensorRT build's
    optimisation profiles) and the build's limits."""
    return {
        **engine_fields(ckpt, component, args),
        **decoder_fields(decoder, args.dtype),
        "eos_token_id": eos_token_ids(ckpt, config),
        "pad_token_id": config.get("pad_token_id"),
        "generation_defaults": generation_defaults(ckpt),
        "profiles": decoder_profiles(args),
        "builder_config": build_limits(args),
    }


def build_limits(args: Any) -> dict[str, Any]:
    """The build's limits (family.BuildArgs), the engine config's ``builder_config``."""
    return {
        "max_batch_size": args.max_batch_size,
        "max_input_len": args.max_input_len,
        "max_kv_cache_capacity": args.max_kv_cache_capacity,
    }


def decoder_profiles(args: Any) -> dict[str, Any]:
    """The shapes each phase of a decoder binds (the engine config's ``profiles``); a TensorRT
    build turns these into optimisation profiles."""
    return {
        "prefill": {"batch": [1, args.max_batch_size], "seq": [1, args.max_input_len]},
        "decode": {"batch": [1, args.max_batch_size], "seq": [1, 1]},
        "kv_capacity": args.max_kv_cache_capacity,
    }


def write_engine_config(out_dir: Path, config: dict[str, Any]) -> None:
    body = {"format": FORMAT, **config}
    (out_dir / ENGINE_CONFIG).write_text(json.dumps(body, indent=2) + "\n")
