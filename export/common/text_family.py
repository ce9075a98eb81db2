"""The build hooks (export/family.py's FamilyHooks) of a text model family: one llm, a Qwen3
decoder run by the generic text model's runner, and at most one media encoder beside it that
the runner calls (no stage of its own). A family declares only what differs, as a TextFamily
(where its decoder's config section and weights are, its lm_head, its encoder), and names that
declaration in its registry entry (``module:attribute``)."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError, section
from edgeomni.export.common.checkpoint import position_limits as position_limits_of
from edgeomni.export.common.decoder import DTYPES, CausalLM, DecoderConfig, decoder_dtype
from edgeomni.export.common.decoder_weights import load_decoder
from edgeomni.export.common.memory_plan import F32, decoder_memory, float_memory, table_rows
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.common.shapes import DimRanges, decoder_ranges
from edgeomni.export.common.text_config import decoder_config
from edgeomni.export.family import BuildArgs, Component, ComponentMemory
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage

LLM = Component("llm", ".", "llm.onnx", LLM_RUNNER)


@dataclass(frozen=True)
class Encoder:
    """A media encoder the llm's runner calls, built when the checkpoint has it."""

    component: Component
    weights: str  # the prefix of its weights
    config: str  # its config section (a checkpoint with config files alone: --estimate)
    inputs: tuple[Input, ...]  # the request inputs the llm stage reads once it is built
    export: Callable[[Checkpoint, Path], Path]  # to ONNX at the path (float32)
    engine_config: Callable[[Checkpoint, BuildArgs], dict[str, Any]]
    ranges: Callable[[Checkpoint, BuildArgs], DimRanges]
    module: Callable[[Checkpoint], torch.nn.Module]  # as its export builds it (--estimate)
    check: Callable[[Checkpoint], object]  # reads what engine_config will (preflight)


@dataclass
class TextFamily:
    """A text family's declaration; its methods are the build hooks. Not frozen: tests patch
    a hook on it as on a module."""

    text: tuple[str, ...]  # the decoder's config section (): the top level
    prefix: str  # the decoder's weights: the checkpoint's name of our "model.*"
    lm_head: Callable[[Checkpoint], str]  # the checkpoint's name of the head (a tied one's table)
    decoder: Callable[[dict[str, Any]], DecoderConfig] | None = None  # None: text_config's
    encoder: Encoder | None = None
    inputs: tuple[Input, ...] = ()  # request inputs the llm stage always reads beside messages
    # the llm's engine config keys beside (and over) artifacts.text_engine_config's
    fields: Callable[[Checkpoint, DecoderConfig], dict[str, Any]] = lambda ckpt, dec: {}

    def decoder_config(self, config: dict[str, Any]) -> DecoderConfig:
        """The llm's dimensions: the family's reader, else its section as text_config.py reads
        any (rope theta 10000 where none is named: Qwen3Config's default)."""
        if self.decoder is not None:
            return self.decoder(config)
        where = "".join(f"{s}." for s in self.text)
        return decoder_config(section(config, *self.text), 10000.0, where)

    def components(self, ckpt: Checkpoint) -> tuple[Component, ...]:
        """The llm; the encoder too when the checkpoint has its weights (or, with its config
        files alone, its config section)."""
        enc = self.encoder
        if enc is None:
            return (LLM,)
        try:
            has = any(ckpt.names(enc.weights))
        except CheckpointError:
            has = isinstance(ckpt.config.get(enc.config), dict)
        return (LLM, enc.component) if has else (LLM,)

    def preflight(self, ckpt: Checkpoint, components: Sequence[Component], args: BuildArgs) -> None:
        """What the build reads of config.json and the small files, before any export."""
        dec = self.decoder_config(ckpt.config)
        if LLM in components:
            artifacts.require_tokenizer(ckpt)
            self.fields(ckpt, dec)
        if self.encoder is not None and self.encoder.component in components:
            self.encoder.check(ckpt)

    def position_limits(
        self, ckpt: Checkpoint, components: Sequence[Component]
    ) -> dict[str, tuple[str, int]]:
        """The llm's position limit, for edge-build's warning past it."""
        return position_limits_of(ckpt.config, {LLM.name: self.text}, (c.name for c in components))

    def dim_ranges(self, ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
        """The sizes each component is called with (export/common/shapes.py)."""
        if component == LLM:
            return decoder_ranges(args.max_batch_size, args.max_input_len,
                                  args.max_kv_cache_capacity)  # fmt: skip
        assert self.encoder is not None
        return self.encoder.ranges(ckpt, args)

    def memory_plan(
        self, ckpt: Checkpoint, component: Component, args: BuildArgs
    ) -> ComponentMemory:
        """edge-build --estimate's view: the exported modules on the meta device, the float32
        embedding table, the llm's KV cache."""
        with torch.device("meta"):
            if component != LLM:
                assert self.encoder is not None
                return float_memory(self.encoder.module(ckpt))
            module = CausalLM(self.decoder_config(ckpt.config))
            module = module.to(DTYPES.get(args.dtype, torch.float32))
        return decoder_memory(module, {"embedding": (table_rows(module), F32)}, args.dtype)

    def load_llm(self, ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
        """The llm with the checkpoint's weights: our "model.X" is its ``prefix`` + X."""
        module = CausalLM(self.decoder_config(ckpt.config)).eval()
        prefix = self.prefix

        def get(name: str) -> torch.Tensor:
            ours = name.startswith("model.") and not name.startswith(prefix)
            return ckpt.tensor(prefix + name[len("model.") :] if ours else name)

        load_decoder(module, get, prefix="", lm_head=self.lm_head(ckpt), dtype=dtype,
                     where=str(ckpt.path))  # fmt: skip
        return module

    def export_component(
        self, ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
    ) -> Path:
        dtype, path = decoder_dtype(ckpt, args), work_dir / component.engine
        if component != LLM:
            assert self.encoder is not None
            return self.encoder.export(ckpt, path)
        # the runner looks its inputs up in a float32 table (artifacts.write_embedding), media
        # rows spliced in
        return export_causal_lm(self.load_llm(ckpt, dtype), path,
                                logits_topk=args.logits_topk or 0, float32_embeds=True)  # fmt: skip

    def write_artifacts(
        self, ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs
    ) -> None:
        if component != LLM:
            assert self.encoder is not None
            artifacts.write_engine_config(out_dir, self.encoder.engine_config(ckpt, args))
            return
        dec = self.decoder_config(ckpt.config)
        artifacts.write_embedding(ckpt.tensor(self.prefix + "embed_tokens.weight"), out_dir)
        artifacts.write_tokenizer(ckpt, out_dir)
        config = artifacts.text_engine_config(ckpt, component, args, dec, ckpt.config)
        artifacts.write_engine_config(out_dir, {**config, **self.fields(ckpt, dec)})

    def multistage_topology(
        self, bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
    ) -> Graph | None:
        """None without the llm; without the encoder the stage reads text (and ``inputs``)."""
        enc = self.encoder
        built = enc is not None and enc.component.name in components
        inputs = (*self.inputs, *(enc.inputs if built and enc else ()))
        return llm_graph(components, inputs, (enc.component.name,) if enc else ())


def llm_graph(
    components: Mapping[str, str],
    inputs: Sequence[Input] = (),
    encoders: Sequence[str] = (),
) -> Graph | None:
    """One llm.backbone stage, its encoders no stages of their own (the stage's runner calls
    them); None without the llm. The stage reads the request's messages, then ``inputs``. Each
    of ``encoders`` that was built is named in the stage config, relative to the llm's folder,
    only where the runtime would not find it by itself (``kind/`` or ``multimodal/kind/``
    beside the llm: runtime/media/hook.py), as after ``edge-build --graph-only`` over another
    tool's layout."""
    if "llm" not in components:
        return None
    where = {
        kind: posixpath.relpath(components[kind], components["llm"])
        for kind in encoders
        if kind in components
    }
    named = {k: w for k, w in where.items() if w not in (k, f"multimodal/{k}")}
    stage = Stage("llm", LLM_RUNNER, components["llm"], "autoregressive",
                  (Input("prompt", "request:messages", "fail"), *inputs),
                  (Emit("text", "text", "chunk_stream", terminal=True),),
                  config={"encoders": named} if named else {})  # fmt: skip
    return Graph(SCHEMA_VERSION, ("llm:text",), (stage,))
