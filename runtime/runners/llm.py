"""llm.backbone: messages in, text out, through one decoder engine with an in-place KV cache.

Generic: a request's audio and image parts go through the media hook the model's family
declares for its config's model_type (runtime/prompt.py); without one, the model reads text."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import Artifact, Checked, check_folder
from edgeomni.runtime.decoder import DecoderSession, right_pad, text_positions
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.kv import KVCache
from edgeomni.runtime.prompt import Prompt, media_hook, media_parts
from edgeomni.runtime.requests import TEXT_MODEL_KEYS
from edgeomni.runtime.runners import (
    HiddenHandoff,
    RequestError,
    RequestState,
    StageRunner,
    feed_cohort,
)
from edgeomni.runtime.sampling import log_softmax_top, sample_step
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
        "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_key_value_heads",
        "head_dim", "builder_config.max_batch_size", "builder_config.max_input_len",
        "builder_config.max_kv_cache_capacity",
    ),
    tables={"embedding.safetensors": ("embedding",)},
    tokenizer=True,
)  # fmt: skip


class LLMBackbone(StageRunner):
    """Prefill the cohort as one right-padded batch, then decode it one token per step."""

    kind = "autoregressive"
    reads = frozenset((*TEXT_MODEL_KEYS, "repetition_penalty", "seed", "sampling_seed"))
    streams_steps = True

    def __init__(
        self,
        stage: Any,
        folder: Path,
        *,
        engines: Engines = DEFAULT_ENGINES,
    ) -> None:
        """``engines``: how its engines open (its ``spin`` False when other stages' engines run
        between this one's steps)."""
        self.stage = stage
        checked = self.check(stage, folder)
        self.config: dict[str, Any] = checked.config
        cfg = self.config
        self.engine = engines.open(folder, cfg)
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
        self.hidden_layer = cfg.get("hidden_output_layer")
        # the family's media preparation for this model type, or text only (runtime/prompt.py)
        self.media = media_hook(cfg)(
            folder, cfg, threads=engines.threads, locations=stage.config.get("encoders")
        )
        self.kv = KVCache.for_decoder(cfg, self.max_batch, self.capacity, self.engine)

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Checked:
        """What opening this stage reads, checked without loading an engine: its config, table
        and tokenizer, and what its model type's media hook reads (the media encoders it finds
        beside it)."""
        checked = check_folder(folder, ARTIFACT)
        media_hook(checked.config).check(folder, checked.config, stage.config.get("encoders"))
        return checked

    # -- per request -------------------------------------------------------------------------
    def prompt_text(self, request: Any) -> tuple[str, str]:
        """The prompt as the model reads it, and the part its leading system messages make
        (llm_inference's ``formatted_complete_request`` and ``formatted_system_prompt``)."""
        if request.apply_chat_template and self.tokenizer.has_chat_template:
            messages = [template_message(m) for m in request.messages]
            text = self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=request.add_generation_prompt,
                enable_thinking=request.enable_thinking,
            )
            lead = 0
            while lead < len(messages) and messages[lead]["role"] == "system":
                lead += 1
            system = ""
            if lead:
                system = self.tokenizer.apply_chat_template(
                    messages[:lead], add_generation_prompt=False,
                    enable_thinking=request.enable_thinking,
                )  # fmt: skip
            return text, system
        if request.apply_chat_template:
            raise RequestError("this engine has no chat template; set apply_chat_template false")
        return "".join(message_text(m) for m in request.messages), ""

    def prompt_ids(self, request: Any) -> list[int]:
        return self.tokenizer.encode(self.prompt_text(request)[0])

    def prepare(self, state: RequestState) -> Prompt:
        """Tokenize, encode media, and check the request against the build's limits, before any
        cohort runs."""
        parts = media_parts(state.request.messages)
        if parts and not state.request.apply_chat_template:
            raise RequestError("audio and image parts need apply_chat_template")
        self.media.require(parts)
        try:
            text, system = self.prompt_text(state.request)
        except ValueError as e:  # the chat template's own error, or one rendering these parts
            raise RequestError(str(e)) from None
        state.entry.update(formatted_system_prompt=system, formatted_complete_request=text)
        ids = self.tokenizer.encode(text)
        bias = state.request.logit_bias
        if bias and bias[-1][0] >= self.vocab_size:
            raise RequestError(
                f"logit_bias names token {bias[-1][0]}; the vocabulary has {self.vocab_size}"
            )
        prompt = self.media.expand(ids, parts)
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
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """One right-padded prefill call's ids [n, S], embeddings, positions and extra inputs:
        media rows over their placeholders, 3-D positions, DeepStack features."""
        n = len(prompts)
        ids = right_pad([p.ids for p in prompts])
        width = ids.shape[1]
        embeds = self.embedding[ids]
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
        return ids, embeds, positions, extra

    def decode_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """A decode step's extra inputs (DeepStack adds nothing after the prompt)."""
        if not self.deepstack:
            return {}
        return {"deepstack_embeds": np.zeros((self.deepstack, rows, 1, self.hidden_size),
                                             np.float32)}  # fmt: skip

    def slot_stage(self, *, stream_upstream: bool = False) -> Any:
        """This stage for the in-flight scheduler: requests join and leave a running batch (a
        first stage: nothing upstream to stream from)."""
        from edgeomni.runtime.runners.llm_slots import TextSlots

        return TextSlots(self)

    def finish_text(self, request: Any, out_ids: list[int], finish: str | None) -> str:
        """The reply's text: without the end-of-sequence token, cut at a stop string."""
        text_ids = out_ids[:-1] if finish == "eos" else out_ids
        text = self.tokenizer.decode(text_ids)
        return _cut_at_stop(text, request.stop) if finish == "stop" else text

    # -- per cohort --------------------------------------------------------------------------
    def run(self, cohort: Sequence[RequestState]) -> None:
        for _ in self.steps(cohort):
            pass

    def steps(self, cohort: Sequence[RequestState]) -> Iterator[None]:
        """``run`` one decode step at a time: yields after each step, so a downstream stage can
        read the hidden-state handoff (``accept_hidden``) while this stage decodes. The stage's
        times count only the work done here, not what runs between the steps."""
        n = len(cohort)
        prompts = [state.prepared[self.stage.id] for state in cohort]
        limits = [state.request.max_generate_length for state in cohort]
        minimum = [state.request.min_generate_length for state in cohort]
        params = cohort[0].request.sampling  # batch-wide: the scheduler groups equal settings
        # each row its own generator: a request's draws depend on its seed, not its neighbours
        rng = [np.random.default_rng(state.request.sampling.seed) for state in cohort]
        penalise = params.repetition_penalty != 1.0
        hidden_port = f"{self.stage.id}:accept_hidden"
        keep_hidden = self.hidden_layer is not None and any(hidden_port in s.wanted for s in cohort)

        outputs = {"logits": (self.vocab_size,)}
        if self.hidden_layer is not None:
            outputs["hidden_states"] = (self.hidden_size,)
        session = DecoderSession(self.engine, self.kv, n, outputs, per_position=("hidden_states",))
        ids, embeds, positions, extra = self.prefill_feeds(prompts)
        lens = np.array([len(p) for p in prompts], np.int32)
        width = ids.shape[1]
        zeros = np.zeros(n, np.int32)
        deltas = np.array([p.delta for p in prompts], np.int32)
        start = time.perf_counter()
        # one right-padded call from an empty cache, whether or not the engine's attention takes
        # per-row query lengths: a row's padding sits after its last token, so causal attention
        # never lets a real token see it (tests/prefill_check.py)
        out = session.run(embeds, positions, zeros, lens, lens - 1, **extra)
        prefill_s = time.perf_counter() - start
        prefill_engine_s = session.engine_seconds
        # the talker reads the accept-layer state of a prompt's media positions only: a decode
        # step's hidden state, and a text-only prompt's, never leave the device
        handoffs: list[HiddenHandoff] = []
        if keep_hidden:
            for r, (p, state) in enumerate(zip(prompts, cohort, strict=True)):
                hidden = out["hidden_states"][r, : lens[r]].copy() if p.spans else None
                handoff = HiddenHandoff(
                    np.asarray(p.ids, np.int64), hidden, p.image_grids, p.audio_frames
                )
                state.outputs[hidden_port] = handoff
                handoffs.append(handoff)
            # the prompt and the first tokens of the reply; the buffer doubles when they do not
            fed = feed_cohort(handoffs, width + min(max(limits), 64), self.hidden_size)
            for r, handoff in enumerate(handoffs):
                handoff.feed(embeds[r, : lens[r]])

        generated: list[list[int]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        bias = _bias_rows(cohort)
        top_n = [state.request.num_logprobs for state in cohort]
        logprobs: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(n)]
        # each row's prompt and generated ids, one array: the penalty's input is row views,
        # not an np.append of every row's history each step
        history = np.zeros((n, width + max(limits)), np.int64) if penalise else None
        if history is not None:
            history[:, :width] = ids
        past = lens.copy()
        steps = 0
        full_rows = 0  # rows whose full logits had to come to the host
        extra = self.decode_feeds(n)
        decode_s = 0.0
        start = time.perf_counter()
        while True:
            banned = [self._eos_ids if len(generated[r]) < minimum[r] else None for r in range(n)]
            seen = None
            if history is not None:
                seen = [history[r, : lens[r] + len(generated[r])] for r in range(n)]
            step = out.logits()
            tokens, fetched = sample_step(step, params, rng, seen, banned, bias)
            full_rows += fetched
            asked = np.array([r for r in range(n) if top_n[r] and finish[r] is None], np.int64)
            if asked.size:  # from the model's logits, before bias and penalty
                ids_, values = log_softmax_top(step.full(asked), max(top_n[r] for r in asked))
                for j, r in enumerate(asked):
                    logprobs[r].append((ids_[j, : top_n[r]], values[j, : top_n[r]]))
                full_rows += int(asked.size)
            for row in range(n):
                if finish[row] is not None:
                    continue
                token = int(tokens[row])
                generated[row].append(token)
                if history is not None:
                    history[row, lens[row] + len(generated[row]) - 1] = token
                finish[row] = self.finished(cohort[row].request, generated[row], limits[row])
                if handoffs and finish[row] is not None:  # its last token is never fed
                    handoffs[row].done = True
                    handoffs[row].finished_by_eos = finish[row] == "eos"
            active = np.array([f is None for f in finish])
            if not active.any():
                break
            step_embeds = self.embedding[tokens][:, None, :]
            out = session.run(
                step_embeds,
                text_positions(past + deltas, 1, self.mrope),
                past,
                active.astype(np.int32),
                np.zeros(n, np.int64),
                **extra,
            )
            if handoffs:
                rows = np.flatnonzero(active)
                fed.step(rows, step_embeds[rows, 0])
            past = past + active.astype(np.int32)
            steps += 1
            decode_s += time.perf_counter() - start
            yield
            start = time.perf_counter()
        decode_s += time.perf_counter() - start
        decode_engine_s = session.engine_seconds - prefill_engine_s

        for row, state in enumerate(cohort):
            out_ids = generated[row]
            text = self.finish_text(state.request, out_ids, finish[row])
            state.outputs[f"{self.stage.id}:text"] = text
            if top_n[row]:
                state.entry["logprobs"] = [self.logprob_step(*pair) for pair in logprobs[row]]
            state.details[self.stage.id] = {
                "prompt_tokens": len(prompts[row]),
                "output_tokens": out_ids,
                "generated_tokens": len(out_ids),
                "finish_reason": finish[row],
                "prefill_ms": round(prefill_s * 1e3, 3),
                "prefill_engine_ms": round(prefill_engine_s * 1e3, 3),
                "decode_ms": round(decode_s * 1e3, 3),
                "decode_engine_ms": round(decode_engine_s * 1e3, 3),
                "decode_steps": steps,
                "decode_tokens_per_s": round(steps * n / decode_s, 2) if decode_s > 0 else None,
                "full_logit_rows": full_rows,
                "cohort_size": n,
            }

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

    def finished(self, request: Any, out: list[int], limit: int) -> str | None:
        if out[-1] in self.eos:
            return "eos"
        if request.stop and any(s in self.tokenizer.decode(out) for s in request.stop):
            return "stop"
        if len(out) >= limit:
            return "length"
        return None


def request_bias(request: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """A request's logit_bias as (ids, float32 values), or None."""
    if not request.logit_bias:
        return None
    ids, values = zip(*request.logit_bias, strict=True)
    return np.array(ids, np.int64), np.array(values, np.float32)


def _bias_rows(cohort: Sequence[RequestState]) -> list[tuple[np.ndarray, np.ndarray] | None] | None:
    """Each row's logit_bias, None for a row without one; None when no row has one."""
    rows = [request_bias(state.request) for state in cohort]
    return rows if any(r is not None for r in rows) else None


def _cut_at_stop(text: str, stops: Sequence[str]) -> str:
    cut = min((text.find(s) for s in stops if s in text), default=len(text))
    return text[:cut]
