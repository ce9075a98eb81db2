"""llm.backbone: messages in, text out, through one decoder engine with an in-place KV cache.

Generic: a request's audio, image and video parts go through the media hook the model's family
declares for its config's model_type (runtime/prompt.py); without one, the model reads text.
A model type whose family declares a speech-to-text form (runtime/family.py's
``transcription``: an ASR model's) also has it apply the request's controls to the messages
(a forced language starts the reply) and parse each reply into its ``language`` and
``transcript``, which the predictions entry carries beside ``output_text``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import Artifact, Checked, check_folder
from edgeomni.runtime.decoder import StepOutputs, right_pad, text_positions
from edgeomni.runtime.decoder_stage import DecoderStage, Slot
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.events import Event, HiddenRows, TextDelta
from edgeomni.runtime.prompt import Prompt, PromptRows, media_hook, media_parts
from edgeomni.runtime.requests import TEXT_MODEL_KEYS
from edgeomni.runtime.row_state import RowState
from edgeomni.runtime.stage import RequestError, RequestState, StageRunner, load_factory
from edgeomni.runtime.tokenizer import TextTokenizer


def message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part.get("type") == "text")


def template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """Text-only content goes to the chat template as one string (what simple templates expect);
    content with media parts goes as its part list, which the model's template renders."""
    content = message.get("content", "")
    if isinstance(content, str) or all(p.get("type") == "text" for p in content):
        return {"role": message["role"], "content": message_text(message)}
    return {"role": message["role"], "content": [dict(p) for p in content]}


ARTIFACT = Artifact(
    keys=(
        "model_type", "vocab_size", "state", "hidden_size", "num_hidden_layers",
        "num_key_value_heads", "head_dim", "builder_config.max_batch_size",
        "builder_config.max_input_len", "builder_config.max_kv_cache_capacity",
    ),
    tables={"embedding.safetensors": ("embedding",)},
    tokenizer=True,
)  # fmt: skip


def _attempt(call: Any, *args: Any) -> Any:
    """``call(*args)``, or the exception that fails the one request it was for."""
    try:
        return call(*args)
    except Exception as e:
        return e


class LLMBackbone(StageRunner):
    """The text model: a request's prompt (its media through the family's hook) prefilled into
    a cache row, then one token per step; the decoder stage's spec (runtime/decoder_stage.py)
    for text: token embeddings in, eos and stop strings, text deltas out."""

    kind = "autoregressive"
    reads = frozenset((*TEXT_MODEL_KEYS, "repetition_penalty", "seed", "sampling_seed"))
    consumes = False  # the first stage of its graphs
    per_position = ("hidden_states",)  # the prompt's accept-layer states, for its talker
    prefill_fetch: tuple[str, ...] = ()

    def __init__(self, stage: Any, folder: Path, *, engines: Engines = DEFAULT_ENGINES) -> None:
        """``engines``: how its engines open (its ``spin`` False when other stages' engines run
        between this one's steps)."""
        checked = self.open_stage(stage, folder, engines)
        cfg = self.config
        self.embedding = safetensors_np.load(folder / "embedding.safetensors")["embedding"]
        self.tokenizer: TextTokenizer = checked.tokenizer
        limits = cfg["builder_config"]
        self.max_batch = int(limits["max_batch_size"])
        self.max_input_len = int(limits["max_input_len"])
        self.capacity = int(limits["max_kv_cache_capacity"])
        self.vocab_size = int(cfg["vocab_size"])
        self._bytes: dict[int, bytes] = {}  # token id -> its bytes, for logprobs
        self.eos = frozenset(cfg.get("eos_token_id") or ())
        self._eos_ids = np.array(sorted(self.eos), np.int64)
        self.hidden_size = int(cfg["hidden_size"])
        self.mrope = bool(cfg.get("mrope_section"))
        self.deepstack = int(cfg.get("deepstack_layers") or 0)
        # the prefill's extra feeds' row axes (the context cache keys their positions)
        self.prefill_axes = {"deepstack_embeds": 1} if self.deepstack else {}
        self.hidden_layer = cfg.get("hidden_output_layer")
        # the family's media preparation for this model type, or text only (runtime/prompt.py)
        self.media = media_hook(cfg)(
            folder, cfg, threads=engines.threads, locations=stage.config.get("encoders"),
            tokenizer=self.tokenizer, max_image_pixels=engines.max_image_pixels,
        )  # fmt: skip
        self.transcription = transcription_form(cfg)
        self.state = RowState.for_engine(
            cfg, self.max_batch, self.engine, self.capacity, folder / "config.json"
        )
        self.stage_id: str = stage.id
        self._hidden_port = f"{stage.id}:accept_hidden"
        self.outputs: dict[str, tuple[int, ...]] = {"logits": (self.vocab_size,)}
        if self.hidden_layer is not None:
            self.outputs["hidden_states"] = (self.hidden_size,)

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Checked:
        """What opening this stage reads, checked without loading an engine: its config, table
        and tokenizer, and what its model type's media hook reads (the media encoders it finds
        beside it)."""
        checked = check_folder(folder, ARTIFACT)
        media_hook(checked.config).check(folder, checked.config, stage.config.get("encoders"))
        return checked

    # -- per request -------------------------------------------------------------------------
    def messages(self, request: Any) -> tuple[list[Mapping[str, Any]], bool]:
        """The request's messages as the model reads them, and whether the last one is
        continued (``continue_final_message``, or a transcription form's control that starts
        the reply, such as a forced language)."""
        messages, continued = list(request.messages), request.continue_final_message
        controls = getattr(self.transcription, "request_messages", None)
        if controls is not None:
            forced = controls(messages, request.speech)
            if forced is not None:
                messages, continued = forced, True
        return messages, continued

    def prompt_text(self, request: Any) -> tuple[str, str, str]:
        """The prompt as the model reads it, the part its leading system messages make
        (llm_inference's ``formatted_complete_request`` and ``formatted_system_prompt``), and
        the start of the reply it already holds (the text of a continued assistant message)."""
        messages, continued = self.messages(request)
        start = ""
        if continued and messages[-1]["role"] == "assistant":
            start = message_text(messages[-1])
        if request.apply_chat_template and self.tokenizer.has_chat_template:
            messages = [template_message(m) for m in messages]
            text = self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=request.add_generation_prompt,
                enable_thinking=request.enable_thinking,
                continue_final_message=continued,
            )
            lead = next((i for i, m in enumerate(messages) if m["role"] != "system"),
                        len(messages))  # fmt: skip
            system = ""
            if lead:
                system = self.tokenizer.apply_chat_template(
                    messages[:lead], add_generation_prompt=False,
                    enable_thinking=request.enable_thinking,
                )  # fmt: skip
            return text, system, start
        if request.apply_chat_template:
            raise RequestError("this engine has no chat template; set apply_chat_template false")
        return "".join(message_text(m) for m in messages), "", start

    def prepare(self, state: RequestState) -> Prompt:
        """Tokenize, encode media, and check the request against the build's limits, before any
        cohort runs."""
        (out,) = self.prepare_many([state])
        if isinstance(out, Exception):
            raise out
        return out

    def prepare_many(self, states: list[RequestState]) -> list[Any]:
        """``prepare`` for requests that arrived together: each rendered and tokenized, then
        the media of all of them encoded by the hook in shared encoder calls
        (``expand_many``), then each checked against the build's limits."""
        out: list[Any] = [None] * len(states)
        rendered = []
        for i, state in enumerate(states):
            try:
                rendered.append((i, *self._render(state)))
            except Exception as e:
                out[i] = e
        expand_many = getattr(self.media, "expand_many", None)
        items = [(ids, parts) for _, ids, parts, _ in rendered]
        if expand_many is not None:
            prompts = expand_many(items)
        else:
            prompts = [_attempt(self.media.expand, ids, parts) for ids, parts in items]
        for (i, _, _, start), prompt in zip(rendered, prompts, strict=True):
            if not isinstance(prompt, Exception):
                prompt.reply_start = start
                prompt = _attempt(self._check_limits, states[i], prompt)
            out[i] = prompt
        return out

    def _render(self, state: RequestState) -> tuple[list[int], list[Any], str]:
        """The request's prompt ids and media parts (rendered by its chat template), and the
        start of the reply its prompt already holds."""
        parts = media_parts(state.request.messages)
        if parts and not state.request.apply_chat_template:
            raise RequestError("audio, image and video parts need apply_chat_template")
        self.media.require(parts)
        try:
            text, system, start = self.prompt_text(state.request)
        except ValueError as e:  # the chat template's own error, or one rendering these parts
            raise RequestError(str(e)) from None
        state.entry.update(formatted_system_prompt=system, formatted_complete_request=text)
        ids = self.tokenizer.encode(text)
        bias = state.request.logit_bias
        if bias and bias[-1][0] >= self.vocab_size:
            raise RequestError(
                f"logit_bias names token {bias[-1][0]}; the vocabulary has {self.vocab_size}"
            )
        return ids, parts, start

    def _check_limits(self, state: RequestState, prompt: Prompt) -> Prompt:
        ids = prompt.ids
        if not len(ids):
            raise RequestError("the prompt is empty")
        if len(ids) > self.max_input_len:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the engine was built for at most "
                f"{self.max_input_len} (--max-input-len)"
            )
        need = len(ids) + state.request.max_generate_length
        if need > self.capacity:
            raise RequestError(
                f"the prompt ({len(ids)} tokens) plus max_generate_length "
                f"({state.request.max_generate_length}) needs {need} cache slots; the engine was "
                f"built with {self.capacity} (--max-kv-cache-capacity)"
            )
        return prompt

    def prefill_feeds(
        self, prompts: Sequence[Prompt]
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """One right-padded prefill call's embeddings [n, S, H], positions and extra inputs:
        media rows over their placeholders, 3-D positions, DeepStack features."""
        n = len(prompts)
        embeds = self.embedding[right_pad([p.ids for p in prompts])]
        width = embeds.shape[1]
        positions = text_positions(np.zeros(n, np.int32), width, self.mrope)
        extra: dict[str, np.ndarray] = {}
        if self.deepstack:
            extra["deepstack_embeds"] = np.zeros(
                (self.deepstack, n, width, self.hidden_size), np.float32
            )
        for row, p in enumerate(prompts):
            for begin, rows in p.spans:
                embeds[row, begin : begin + len(rows)] = rows
            for begin, deep in p.deepstack:
                span = slice(begin, begin + deep.shape[1])
                extra["deepstack_embeds"][:, row, span] = deep[: self.deepstack]
            if p.positions is not None:
                positions[:, row, : len(p)] = p.positions
        return embeds, positions, extra

    def decode_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """A decode step's extra inputs (DeepStack adds nothing after the prompt)."""
        if not self.deepstack:
            return {}
        return {"deepstack_embeds": np.zeros((self.deepstack, rows, 1, self.hidden_size),
                                             np.float32)}  # fmt: skip

    # -- the decoder stage's spec (runtime/decoder_stage.py) ---------------------------------
    def slot_stage(self, *, stream_upstream: bool = False) -> DecoderStage:
        """This stage for the scheduler loop (a first stage: nothing upstream to stream)."""
        return DecoderStage(self)

    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        return upstream_done

    def open(self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]) -> list[Slot]:
        slots = []
        for state, row, _ in entries:
            prompt: Prompt = state.prepared[self.stage_id]
            request, n = state.request, len(prompt)
            history = None
            if request.sampling.repetition_penalty != 1.0:  # it sees the prompt and the reply
                history = np.zeros(n + request.max_generate_length, np.int64)
                history[:n] = prompt.ids
            hands = self.hidden_layer is not None and self._hidden_port in state.wanted
            slots.append(Slot(
                state, row, _Text(prompt, hands), request.sampling,
                np.random.default_rng(request.sampling.seed), n, delta=prompt.delta,
                bias=request_bias(request), history=history, prefix=n,
                top_logprobs=request.num_logprobs,
            ))  # fmt: skip
        return slots

    def prefill(self, run: Sequence[Slot]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        embeds, positions, extra = self.prefill_feeds([s.data.prompt for s in run])
        for j, slot in enumerate(run):
            slot.data.fed = embeds[j, : slot.length]  # the prompt's rows, handed on if wanted
        return embeds, positions, extra

    def wants_positions(self, slot: Slot) -> bool:
        """Whether ``prefilled`` reads its prompt's per-position states (it hands a prompt
        with media to its talker): the context cache then keeps and restores them too."""
        return slot.data.hands and bool(slot.data.prompt.spans)

    def prefilled(self, run: Sequence[Slot], out: StepOutputs) -> None:
        """A slot that hands its talker rows starts with the prompt's: their embeddings, and
        the accept-layer states of a prompt's media positions (a decode step's hidden state,
        and a text-only prompt's, never leave the device)."""
        for j, slot in enumerate(run):
            text, fed = slot.data, slot.data.fed
            text.fed = None
            if not text.hands:
                continue
            p = text.prompt
            hidden = out["hidden_states"][j, : slot.length].copy() if p.spans else None
            prompt = PromptRows(np.asarray(p.ids, np.int64), hidden, tuple(p.image_grids),
                                tuple(p.audio_frames))  # fmt: skip
            text.pending.append(HiddenRows(slot.state.index, self.stage_id,
                                           np.asarray(fed, np.float32), prompt))  # fmt: skip

    def consume(self, slot: Slot, event: Event) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def can_step(self, slot: Slot) -> bool:
        return True

    def inputs(self, ready: Sequence[Slot], slots: Mapping[int, Slot], last: Any) -> np.ndarray:
        """Each ready row's newest token's embedding (handed on to its talker as it is fed)."""
        rows = self.embedding[np.array([s.generated[-1] for s in ready], np.int64)]
        for slot, row in zip(ready, rows, strict=True):
            if slot.data.hands:
                slot.data.pending.append(HiddenRows(slot.state.index, self.stage_id, row[None]))
        return rows

    def confirm(self, ready: Sequence[Slot]) -> None:
        """Nothing to confirm: its inputs are host rows."""
        return None

    def draw(self, ready: Sequence[Slot], slots: Mapping[int, Slot], out: Any) -> None:
        """Nothing drawn on the device: the stage draws on the host."""
        return None

    def stepped(self, ready: Sequence[Slot]) -> None:
        """Nothing: the next step reads only the tokens drawn."""

    def banned(self, slot: Slot) -> np.ndarray | None:
        """No end of sequence before the request's min_generate_length."""
        return self._eos_ids if len(slot.generated) < slot.state.request.min_generate_length else None

    def finished(self, slot: Slot) -> str | None:
        """eos, a stop string, or the request's max_generate_length."""
        request, out = slot.state.request, slot.generated
        if out[-1] in self.eos:
            return "eos"
        if request.stop and any(s in self.tokenizer.decode(out) for s in request.stop):
            return "stop"
        if len(out) >= request.max_generate_length:
            return "length"
        return None

    def events(self, slot: Slot) -> list[Event]:
        """The rows handed to its talker since the last update, then new text (held back while
        it may still be half a character or the start of a stop string)."""
        text, request = slot.data, slot.state.request
        out: list[Event] = text.pending
        text.pending = []
        if slot.finish is None:
            decoded = self.tokenizer.decode(slot.generated)
            hold = max((len(s) for s in request.stop), default=1) - 1
            safe = decoded[: len(decoded) - hold] if hold else decoded
            safe = safe.rstrip("\ufffd")
        else:
            safe = self.finish_text(request, slot.generated, slot.finish)
        if len(safe) > len(text.sent) and safe.startswith(text.sent):
            ids = tuple(slot.generated[text.sent_ids :])
            out.append(TextDelta(slot.state.index, self.stage_id, safe[len(text.sent) :], ids))
            text.sent, text.sent_ids = safe, len(slot.generated)
        return out

    def move(self, slot: Slot, last: Any) -> None:
        """Nothing of its own: its cache row moves."""

    def retire(self, slot: Slot) -> None:
        """A finished request's text, logprobs and report."""
        state, sid = slot.state, self.stage_id
        text = self.finish_text(state.request, slot.generated, slot.finish)
        state.outputs[f"{sid}:text"] = text
        if self.transcription is not None:  # the reply parsed (as transformers' processor
            language, transcript = self.transcription.parse(text)  # parses the new tokens)
            start = slot.data.prompt.reply_start
            if language is None and start:  # a forced language: the reply's given start names it
                language = self.transcription.parse(start)[0]
            state.entry.update(language=language, transcript=transcript)
        if state.request.num_logprobs:
            state.entry["logprobs"] = [self.logprob_step(*pair) for pair in slot.logprobs]
        decode_s = slot.decode_s
        state.details[sid] = {
            "prompt_tokens": slot.length,
            "cached_tokens": slot.cached,
            "output_tokens": list(slot.generated),
            "generated_tokens": len(slot.generated),
            "finish_reason": slot.finish,
            "prefill_ms": round(slot.prefill_s * 1e3, 3),
            "prefill_engine_ms": round(slot.prefill_engine_s * 1e3, 3),
            "decode_ms": round(decode_s * 1e3, 3),
            "decode_engine_ms": round(slot.decode_engine_s * 1e3, 3),
            "decode_steps": slot.steps,
            "decode_tokens_per_s": round(slot.steps / decode_s, 2) if decode_s > 0 else None,
            "full_logit_rows": slot.full_rows,
            "cohort_size": slot.widest,
        }

    def finish_text(self, request: Any, out_ids: list[int], finish: str | None) -> str:
        """The reply's text: without the end-of-sequence token, cut at a stop string."""
        text = self.tokenizer.decode(out_ids[:-1] if finish == "eos" else out_ids)
        if finish == "stop":
            text = text[: min((text.find(s) for s in request.stop if s in text), default=len(text))]
        return text

    def logprob_step(self, ids: np.ndarray, values: np.ndarray) -> list[dict[str, Any]]:
        """One generated token's candidates as llm_inference writes them: token_id, token (its
        bytes as UTF-8, a partial character replaced), bytes, logprob."""
        out = []
        for token, value in zip(ids.tolist(), values.tolist(), strict=True):
            raw = self._bytes.get(token)
            if raw is None:
                raw = self._bytes[token] = self.tokenizer.token_bytes(token)
            out.append({"token_id": token, "token": raw.decode("utf-8", errors="replace"),
                        "bytes": list(raw), "logprob": value})  # fmt: skip
        return out


@dataclass
class _Text:
    """A text slot's own: its prompt, the text its deltas gave, the rows it hands on."""

    prompt: Prompt
    hands: bool  # it hands its talker rows (accept_hidden)
    fed: Any = None  # the prompt's embeddings, between its prefill and its first report
    pending: list[Event] = field(default_factory=list)  # HiddenRows not yet reported
    sent: str = ""  # the text its deltas gave so far
    sent_ids: int = 0  # the tokens its deltas covered


def transcription_form(config: Mapping[str, Any]) -> Any:
    """The speech-to-text form the family of this config.json's model_type declares
    (runtime/family.py's ``transcription``), imported now; None when it declares none."""
    from edgeomni.runtime.families import TRANSCRIPTION

    factory = TRANSCRIPTION.get(str(config.get("model_type")))
    if factory is None:
        return None
    form = load_factory(factory)
    return form() if isinstance(form, type) else form


def request_bias(request: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """A request's logit_bias as (ids, float32 values), or None."""
    if not request.logit_bias:
        return None
    ids, values = zip(*request.logit_bias, strict=True)
    return np.array(ids, np.int64), np.array(values, np.float32)
