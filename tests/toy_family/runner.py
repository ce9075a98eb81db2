"""The toy family's stages. ``Shift``: a request's last user message, each character's code
point shifted by the engine (and by the request's ``rot``), as one call; a StageRunner whose
stage is a ``CallStage`` (runtime/call_stage.py): one call per request. ``Guide``: a tiny decoder
over bytes run by the generic decoder stage (runtime/decoder_stage.py), whose spec declares
classifier-free guidance: a request with ``guidance_scale`` holds two rows, its message's bytes
and its ``negative_prompt``'s, each after the start token."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import Artifact, Checked, check_folder
from edgeomni.runtime.call_stage import CallStage
from edgeomni.runtime.decoder import StepOutputs, right_pad, text_positions
from edgeomni.runtime.decoder_stage import DecoderStage, Slot
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.events import Event, TextDelta
from edgeomni.runtime.requests import TEXT_MODEL_KEYS
from edgeomni.runtime.row_state import RowState
from edgeomni.runtime.stage import RequestError, RequestState, StageRunner, stage_source


def last_user_text(state: RequestState) -> str | None:
    return next((m["content"] for m in reversed(state.request.messages)
                 if m["role"] == "user" and isinstance(m["content"], str)), None)  # fmt: skip


class Shift(StageRunner):
    kind = "iterative"
    reads = frozenset({"shift_seed"})

    def __init__(self, stage: Any, folder: Path, *, engines: Engines = DEFAULT_ENGINES) -> None:
        self.stage = stage
        self.config = self.check(stage, folder).config
        self.engine = engines.open(folder, self.config, replay=False)

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Any:
        stage_source(stage, "text")
        return check_folder(folder, Artifact(keys=("builder_config",)))

    def answer(self, state: RequestState) -> list[Any]:
        """Writes the request's text output and report, and returns its text as an event; a
        RequestError fails it alone."""
        text = last_user_text(state)
        if not text:
            raise RequestError("the toy answers a text user message")
        codes = np.array([[ord(c) for c in text]], np.float32)
        out = np.empty_like(codes)
        binding = self.engine.binding()
        binding.bind_output("shifted", out)
        binding.run({"codes": codes})
        rot = int(state.request.speech.get("rot", 0))
        answer = "".join(chr(int(round(v)) + rot) for v in out[0])
        state.outputs[f"{self.stage.id}:text"] = answer
        state.details[self.stage.id] = {"finish_reason": "complete"}
        return [TextDelta(state.index, self.stage.id, answer, ())]

    def slot_stage(self, *, stream_upstream: bool = False) -> CallStage:
        return CallStage(self.stage.id, self.answer)


GUIDE_ARTIFACT = Artifact(
    keys=("state", "hidden_size", "vocab_size", "bos_token_id", "builder_config.max_batch_size",
          "builder_config.max_input_len", "builder_config.max_kv_cache_capacity"),
    tables={"embedding.safetensors": ("embedding",)},
)  # fmt: skip


class Guide(StageRunner):
    """The guide stage's runner and its decoder spec (runtime/decoder_stage.DecoderSpec): a
    prompt of bytes after the start token, a reply of ``max_generate_length`` bytes."""

    kind = "autoregressive"
    reads = frozenset((*TEXT_MODEL_KEYS, "seed", "sampling_seed"))
    consumes = False
    mrope = False
    per_position: tuple[str, ...] = ()
    prefill_fetch: tuple[str, ...] = ()

    def __init__(self, stage: Any, folder: Path, *, engines: Engines = DEFAULT_ENGINES) -> None:
        self.open_stage(stage, folder, engines)
        cfg = self.config
        self.embedding = safetensors_np.load(folder / "embedding.safetensors")["embedding"]
        limits = cfg["builder_config"]
        self.max_batch = int(limits["max_batch_size"])
        self.max_input_len = int(limits["max_input_len"])
        self.capacity = int(limits["max_kv_cache_capacity"])
        self.hidden_size = int(cfg["hidden_size"])
        self.bos = int(cfg["bos_token_id"])
        self.state = RowState.for_engine(cfg, self.max_batch, self.engine, self.capacity,
                                         folder / "config.json")  # fmt: skip
        self.stage_id: str = stage.id
        self.outputs = {"logits": (int(cfg["vocab_size"]),)}

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Checked:
        stage_source(stage, "prompt")
        return check_folder(folder, GUIDE_ARTIFACT)

    def slot_stage(self, *, stream_upstream: bool = False) -> DecoderStage:
        return DecoderStage(self)

    def ids(self, text: str) -> np.ndarray:
        return np.array([self.bos, *text.encode("utf-8")], np.int64)

    def prepare(self, state: RequestState) -> tuple[np.ndarray, ...]:
        """The prompt rows: the message's, and a guided request's unconditional one."""
        text = last_user_text(state)
        if text is None:
            raise RequestError("the toy guide answers a text user message")
        rows = [self.ids(text)]
        if self.guidance(state) is not None:
            rows.append(self.ids(state.request.speech.get("negative_prompt", "")))
        for row in rows:
            if len(row) > self.max_input_len:
                raise RequestError(f"a prompt of {len(row)} tokens; at most {self.max_input_len}")
            if len(row) + state.request.max_generate_length > self.capacity:
                raise RequestError(f"a prompt and reply of {len(row)} + "
                                   f"{state.request.max_generate_length} tokens; the cache "
                                   f"holds {self.capacity}")  # fmt: skip
        return tuple(rows)

    # -- the decoder stage's spec ----------------------------------------------------------------
    def guidance(self, state: RequestState) -> float | None:
        """The request's ``guidance_scale``: two rows, cond then uncond; None: one row."""
        scale = state.request.speech.get("guidance_scale")
        return None if scale is None else float(scale)

    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        return upstream_done

    def open(self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]) -> list[Slot]:
        slots = []
        for state, row, _ in entries:
            rows: tuple[np.ndarray, ...] = state.prepared[self.stage_id]  # type: ignore[assignment]
            sampling = state.request.sampling
            slots.append(Slot(state, row, rows, sampling, np.random.default_rng(sampling.seed),
                              len(rows[0]),
                              lengths=tuple(len(r) for r in rows) if len(rows) > 1 else ()))  # fmt: skip
        return slots

    def prefill(self, run: Sequence[Slot]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        rows = [ids for slot in run for ids in slot.data]
        embeds = self.embedding[right_pad(rows)]
        return embeds, text_positions(np.zeros(len(rows), np.int32), embeds.shape[1], False), {}

    def prefilled(self, run: Sequence[Slot], out: StepOutputs) -> None:
        """Nothing: the first token was drawn."""

    def consume(self, slot: Slot, event: Event) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def can_step(self, slot: Slot) -> bool:
        return True

    def inputs(self, ready: Sequence[Slot], slots: Mapping[int, Slot], last: Any) -> np.ndarray:
        return self.embedding[np.array([s.generated[-1] for s in ready], np.int64)]

    def decode_feeds(self, rows: int) -> dict[str, np.ndarray]:
        return {}

    def confirm(self, ready: Sequence[Slot]) -> None:
        """Nothing to confirm: its inputs are host rows."""
        return None

    def draw(self, ready: Sequence[Slot], slots: Mapping[int, Slot], out: Any) -> None:
        """Nothing drawn on the device: the stage draws on the host."""
        return None

    def stepped(self, ready: Sequence[Slot]) -> None:
        """Nothing: the next step reads only the tokens drawn."""

    def banned(self, slot: Slot) -> np.ndarray | None:
        return None

    def finished(self, slot: Slot) -> str | None:
        return "length" if len(slot.generated) >= slot.state.request.max_generate_length else None

    def text(self, slot: Slot) -> str:
        return bytes(t for t in slot.generated if t < 256).decode("utf-8", errors="replace")

    def events(self, slot: Slot) -> list[Event]:
        """The reply, once it is whole."""
        if slot.finish is None:
            return []
        return [TextDelta(slot.state.index, self.stage_id, self.text(slot), tuple(slot.generated))]

    def move(self, slot: Slot, last: Any) -> None:
        """Nothing of its own: its cache rows move."""

    def retire(self, slot: Slot) -> None:
        state, sid = slot.state, self.stage_id
        state.outputs[f"{sid}:text"] = self.text(slot)
        state.details[sid] = {
            "output_tokens": list(slot.generated), "finish_reason": slot.finish,
            "prompt_tokens": list(slot.lengths or (slot.length,)), "rows": slot.rows,
            "guidance_scale": slot.guidance, "full_logit_rows": slot.full_rows,
            "cohort_size": slot.widest,
        }  # fmt: skip
