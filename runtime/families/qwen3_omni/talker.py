"""qwen3_omni.talker: the thinker's reply in, codec frames [frames, 16] out.

The talker and its code predictor step their rows together, one codec frame at a time (the one
decoder stage, runtime/decoder_stage.py): the talker gives each row's first code, the code
predictor completes the frame's residual codes (one head per group), and the sum of the frame's
code embeddings plus the next text row is the talker's next input. The thinker's rows come as
``HiddenRows`` events (its ``accept_hidden`` port). The prefill is assembled here as transformers' Qwen3-Omni ``generate`` does: the user
turns (text rows through text_projection, audio/image rows through hidden_projection of the
thinker's accept-layer state), then the assistant prefix with the speaker's codec rows.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import CONFIG, Artifact, ArtifactError, Checked, check_folder
from edgeomni.runtime.decoder import StepOutputs, right_pad, text_positions
from edgeomni.runtime.decoder_stage import DecoderStage, Slot
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.events import CodecFrames, Event, Finished, HiddenRows
from edgeomni.runtime.families.qwen3_omni import STAGE_KEYS
from edgeomni.runtime.families.qwen3_omni.code_predictor import CodePredictor, cp_artifact
from edgeomni.runtime.families.qwen3_omni.media import MEDIA_TOKENS
from edgeomni.runtime.families.qwen3_omni.mrope import MropeIds, rope_index
from edgeomni.runtime.kv import KVCache
from edgeomni.runtime.prompt import PromptRows
from edgeomni.runtime.requests import SPEECH_STAGE_KEYS
from edgeomni.runtime.runners import RequestError, RequestState, StageRunner, stage_source
from edgeomni.runtime.sampling import SamplingParams

# transformers' Qwen3-Omni talker and code predictor settings (``SpeechTalker._sampling``)
SAMPLING = MappingProxyType({
    "do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0,
    "repetition_penalty": 1.05, "max_new_tokens": 4096, "min_new_tokens": 0,
    "subtalker_dosample": True, "subtalker_temperature": 1.0, "subtalker_top_k": 50,
    "subtalker_top_p": 0.8,
})  # fmt: skip
GREEDY = SamplingParams(temperature=0.0, top_k=1, top_p=1.0)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclass(frozen=True)
class Projection:
    """transformers' ResizeMLP: fc2(silu(fc1(x)))."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (silu(x @ self.w1.T + self.b1) @ self.w2.T + self.b2).astype(np.float32)


def _projection(tables: dict[str, np.ndarray], name: str) -> Projection:
    t = {k: np.asarray(v, np.float32) for k, v in tables.items() if k.startswith(name + ".")}
    return Projection(
        t[f"{name}.linear_fc1.weight"],
        t[f"{name}.linear_fc1.bias"],
        t[f"{name}.linear_fc2.weight"],
        t[f"{name}.linear_fc2.bias"],
    )


@dataclass
class ThinkerRows:
    """The talker's copy of what its thinker handed it for one request (``HiddenRows`` events
    of the ``accept_hidden`` port): the prompt (``PromptRows``), then the input embedding of
    each token fed to the thinker (the prompt's, then each generated token but the last), so
    the talker can start once it has what its first step needs and read the reply's tokens as
    they come. ``fed`` counts them and ``embeds`` reads them; ``done``: the thinker finished
    the request (its ``Finished`` event), so nothing more will come."""

    prompt: PromptRows
    fed: int = 0
    done: bool = False
    _rows: np.ndarray | None = field(default=None, repr=False)  # [capacity, H], grown by doubling

    @classmethod
    def of(cls, events: Sequence[Event]) -> ThinkerRows | None:
        """The rows of a request's events so far (None: its prompt's rows have not come)."""
        first = next((e for e in events if isinstance(e, HiddenRows)), None)
        if first is None or first.prompt is None:
            return None
        rows = cls(first.prompt)
        for event in events:
            rows.take(event)
        return rows

    @property
    def prompt_ids(self) -> np.ndarray:
        return self.prompt.ids

    @property
    def prompt_len(self) -> int:
        return len(self.prompt.ids)

    def take(self, event: Event) -> None:
        """A thinker event: rows to append, or its end (other events change nothing)."""
        if isinstance(event, HiddenRows):
            if len(event.rows) == 1 and self._rows is not None and self.fed < len(self._rows):
                self._rows[self.fed] = event.rows[0]  # a decode step's row: no reshaping
                self.fed += 1
            else:
                self.feed(event.rows)
        elif isinstance(event, Finished):
            self.done = True

    def feed(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.float32).reshape(-1, np.shape(rows)[-1])
        need = self.fed + len(rows)
        if self._rows is None or need > len(self._rows):  # amortised: appends stay linear
            grown = np.empty((max(need, 2 * self.fed, 64), rows.shape[1]), np.float32)
            if self._rows is not None:
                grown[: self.fed] = self._rows[: self.fed]
            self._rows = grown
        self._rows[self.fed : need] = rows
        self.fed = need

    def embeds(self, lo: int, hi: int) -> np.ndarray:
        """Fed embeddings [lo, hi) (hi <= fed); a view, never changed by later feeds."""
        if hi > self.fed or self._rows is None:
            raise IndexError(f"embeddings up to {hi} asked for, {self.fed} fed so far")
        return self._rows[lo:hi]


@dataclass
class _Prefill:
    embeds: np.ndarray  # [L, H]
    handoff: ThinkerRows
    reply_start: int  # where the assistant turn starts among the thinker's fed tokens
    reply: np.ndarray  # the reply's fed tokens through text_projection, so far [R, H]
    positions: np.ndarray | None = None  # [3, L] when a user turn holds an image
    delta: int = 0  # decode positions are past_len + delta

    def trailing_index(self, step: int) -> int:
        """The reply token whose text row the talker reads at ``step``: its 5th on."""
        return 4 + step

    def can_step(self, step: int) -> bool:
        """Whether the text row ``step`` reads is fed (or the thinker is done)."""
        return self.handoff.done or self.handoff.fed > self.reply_start + self.trailing_index(step)

    @property
    def fed(self) -> int:
        """Reply tokens the thinker has fed so far."""
        return self.handoff.fed - self.reply_start

    def unprojected(self) -> np.ndarray:
        """The fed reply tokens not yet through text_projection."""
        return self.handoff.embeds(self.reply_start + len(self.reply), self.handoff.fed)


@dataclass
class _Plan:
    """A request's prefill inputs as read from its thinker handoff, before projection."""

    state: RequestState
    handoff: ThinkerRows
    user: np.ndarray  # prompt positions in user turns
    user_media: np.ndarray  # which of them are media placeholders (bool)
    user_text: np.ndarray  # the others' input embeddings [u, thinker H]
    media: np.ndarray | None  # the media positions' thinker hidden states
    begin: int  # where the assistant turn starts
    reply: np.ndarray  # reply tokens fed so far [R, thinker H]


def _split(project: Projection, parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``project`` over every part in one call, split back into parts."""
    if not parts:
        return []
    out = project(np.concatenate(parts))
    return np.split(out, np.cumsum([len(x) for x in parts])[:-1])


def _projection_names(name: str) -> tuple[str, ...]:
    return tuple(f"{name}.linear_fc{i}.{p}" for i in (1, 2) for p in ("weight", "bias"))


ARTIFACT = Artifact(
    keys=(
        "num_code_groups", "vocab_size", "hidden_size", "num_hidden_layers",
        "num_key_value_heads", "head_dim", "speakers", "default_speaker", "code_predictor",
        "tts_pad_token_id", "builder_config.max_batch_size",
        "builder_config.max_kv_cache_capacity",
        *(f"ids.{k}" for k in ("im_start", "user", "assistant", "audio", "image", "video",
                               "codec_nothink", "codec_think_bos", "codec_think_eos",
                               "codec_pad", "codec_bos", "codec_eos")),
        *(f"mrope_ids.{k}" for k in MEDIA_TOKENS),
    ),
    tables={
        "embedding.safetensors": ("embedding",),
        "projections.safetensors": (
            *_projection_names("text_projection"), *_projection_names("hidden_projection"),
            "tts_special",
        ),
    },
)  # fmt: skip


@dataclass
class _Speech:
    """A talker slot's own: its prefill (the family's: ``can_step``, ``embeds``, ``positions``,
    ``delta``), its code predictor's settings, its frames so far."""

    prefill: Any
    residual: SamplingParams  # the code predictor's settings
    max_frames: int
    min_frames: int
    # [H] the talker's latest state, the next frame's input, as a host array; None: it is row
    # ``row`` of the last decode step's output, where the engine left it (on a GPU, the device)
    hidden: np.ndarray | None = None
    frames: np.ndarray | None = None  # completed frames [max_frames, G], the first ``made``
    made: int = 0
    sent: int = 0  # frames its events gave
    cp_s: float = 0.0  # its code predictor calls'
    cp_engine_s: float = 0.0
    cp_steps_s: float = 0.0  # every code predictor call of the steps it took part in
    host_frames: int = 0


class SpeechTalker(StageRunner):
    """The talker both Qwen3 speech families share, the decoder stage's spec for speech
    (runtime/decoder_stage.py): the talker engine gives each frame's first code, the code
    predictor (a per-step sub-stage) its residual codes, and the frame's summed embedding plus
    the next text row is the talker's next input. A family's subclass builds the prefill and
    text rows (``_plan``, ``_prefills``, ``_text_rows``), reads its settings (``_sampling``)
    and says when a request can start (``ready``); ``setup`` reads its own tables."""

    kind = "autoregressive"
    # the talker's keys; the request's seed seeds it when talker_seed is not given
    reads = frozenset((*SPEECH_STAGE_KEYS, "seed", "sampling_seed", *STAGE_KEYS))
    mrope = True  # the talker engine takes 3-axis positions (Qwen3-Omni); False: 1-D
    consumes = False
    per_position: tuple[str, ...] = ()
    prefill_fetch = ("last_hidden",)  # the first frame's input, read with the top-K

    def __init__(
        self,
        stage: Any,
        folder: Path,
        *,
        engines: Engines = DEFAULT_ENGINES,
    ) -> None:
        """``engines``' ``spin`` is not taken: the talker's engine and its code predictor's take
        turns every frame, so neither spins waiting for its next call."""
        self.stage = stage
        self.stage_id: str = stage.id
        cfg = self.config = self.check(stage, folder).config
        self.engine = engines.open(folder, cfg, spin=False)
        self.codec_embedding = safetensors_np.load(folder / "embedding.safetensors")["embedding"]
        self.groups = int(cfg["num_code_groups"])
        self.ids: dict[str, int] = cfg["ids"]
        self.vocab_size = int(cfg["vocab_size"])
        self.hidden_size = int(cfg["hidden_size"])
        self.outputs = {"logits": (self.vocab_size,), "last_hidden": (self.hidden_size,)}
        limits = cfg["builder_config"]
        self.max_batch = int(limits["max_batch_size"])
        self.capacity = int(limits["max_kv_cache_capacity"])
        self.kv = KVCache.for_decoder(cfg, self.max_batch, self.capacity, self.engine)
        self.cp = CodePredictor(
            (folder / cfg["code_predictor"]).resolve(), groups=self.groups,
            max_batch=self.max_batch, engines=engines,
        )  # fmt: skip
        self._cp_sessions: dict[int, Any] = {}
        # the talker may not emit the codec's control band, except the end of speech (a GPU
        # build's engine keeps the same band out of its top-K)
        band = np.arange(max(0, self.vocab_size - 1024), self.vocab_size)
        self.suppressed = band[band != self.ids["codec_eos"]]
        self._suppressed_and_eos = np.append(self.suppressed, self.ids["codec_eos"])
        self.stream = False  # a request may start before its upstream is done (slot_stage)
        self.setup(folder, cfg)

    def setup(self, folder: Path, cfg: dict[str, Any]) -> None:
        """The family's own tables and settings, read once the engines are open."""

    # the residual codes are greedy when the talker is and no cp_* key says otherwise
    # (transformers' Qwen3-Omni); False: they follow their own settings only (qwen-tts)
    follows_talker = True

    def sampling_defaults(self) -> Mapping[str, Any]:
        """The family's settings under the keys' names without prefix (``SAMPLING``'s)."""
        return SAMPLING

    def _sampling(self, request: Any) -> tuple[SamplingParams, SamplingParams, int, int]:
        """talker_* keys for the first code, cp_* (or subtalker_*) keys for the residual codes,
        each over ``sampling_defaults``; its max and min frames. ``talker_do_sample`` /
        ``cp_dosample`` false, a temperature 0 or a top-k 1 is greedy."""
        given, defaults = request.stage_settings, self.sampling_defaults()

        def talker(key: str) -> Any:
            return given.get(f"talker_{key}", defaults[key])

        def residual(key: str) -> Any:
            return given.get(f"cp_{key}", given.get(f"subtalker_{key}", defaults[f"subtalker_{key}"]))

        first = SamplingParams(
            temperature=float(talker("temperature")) if talker("do_sample") else 0.0,
            top_k=int(talker("top_k")),
            top_p=float(talker("top_p")),
            repetition_penalty=float(talker("repetition_penalty")),
            seed=given.get("talker_seed", given.get("talker_sampling_seed", request.sampling.seed)),
        )
        cp_given = any(k.startswith(("cp_", "subtalker_")) for k in given)
        if not residual("dosample") or (self.follows_talker and first.greedy and not cp_given):
            rest = GREEDY
        else:
            rest = SamplingParams(temperature=float(residual("temperature")),
                                  top_k=int(residual("top_k")), top_p=float(residual("top_p")))
        return first, rest, int(talker("max_new_tokens")), int(talker("min_new_tokens"))

    def voice_of(self, state: RequestState) -> Any:
        """What a request's report says it spoke with."""
        return state.prepared[self.stage.id]

    def slot_stage(self, *, stream_upstream: bool = False) -> DecoderStage:
        """This stage for the scheduler loop; ``stream_upstream``: a request may start before
        its upstream stage is done with it (Qwen3-Omni's: at its reply's first token)."""
        self.stream = stream_upstream
        return DecoderStage(self)

    # -- the decoder stage's spec (runtime/decoder_stage.py) ---------------------------------
    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        return upstream_done

    def consume(self, slot: Slot, event: Event) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def open(self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]) -> list[Slot]:
        """Slots for these requests; one whose prompt the talker cannot speak is left out, its
        error set. Every request's projections run in one call (``_prefills``)."""
        plans, rows = [], []
        for state, row, events in entries:
            try:
                plans.append(self._plan(state, events))
            except RequestError as e:
                state.error = f"{self.stage_id}: {e}"
                continue
            rows.append(row)
        slots = []
        for plan, prefill, row in zip(plans, self._prefills(plans), rows, strict=True):
            talker, residual, max_frames, min_frames = self._sampling(plan.state.request)
            max_frames = min(max_frames, self.capacity - len(prefill.embeds))
            slots.append(Slot(
                plan.state, row, _Speech(prefill, residual, max_frames, min_frames), talker,
                np.random.default_rng(talker.seed), len(prefill.embeds), delta=prefill.delta,
                history=np.zeros(max(max_frames, 1), np.int64),  # every first code drawn
            ))  # fmt: skip
        return slots

    def prefill(self, run: Sequence[Slot]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        embeds = right_pad([s.data.prefill.embeds for s in run])
        positions = text_positions(np.zeros(len(run), np.int32), embeds.shape[1], self.mrope)
        for j, s in enumerate(run):
            if s.data.prefill.positions is not None:
                positions[:, j, : s.length] = s.data.prefill.positions
        return embeds, positions, {}

    def prefilled(self, run: Sequence[Slot], out: StepOutputs) -> None:
        for j, s in enumerate(run):  # the session is this call's alone: its states to the host
            s.data.hidden = np.array(out["last_hidden"][j], np.float32)

    def can_step(self, slot: Slot) -> bool:
        return slot.data.prefill.can_step(slot.steps)

    def _hidden(self, slot: Slot, last: Any) -> np.ndarray:
        """A slot's latest talker state on the host."""
        if slot.data.hidden is None:
            slot.data.hidden = np.array(last["last_hidden"][slot.row], np.float32)
        return slot.data.hidden

    def _cp_session(self, rows: int) -> Any:
        if rows not in self._cp_sessions:  # its cache lives for one frame: any rows will do
            self._cp_sessions[rows] = self.cp.session(rows)
        return self._cp_sessions[rows]

    def inputs(self, ready: Sequence[Slot], slots: Mapping[int, Slot], last: Any) -> np.ndarray:
        """Complete each ready row's frame (the code predictor over the ready rows, one call
        per residual setting) and return its summed embedding plus the row's next text row."""
        codes = np.empty((len(ready), self.groups), np.int64)
        frame_embed = np.empty((len(ready), self.hidden_size), np.float32)
        first = ready[0].data.residual  # mostly one setting: equal objects compare fast
        if all(s.data.residual is first or s.data.residual == first for s in ready):
            groups: dict[SamplingParams, list[int]] = {first: list(range(len(ready)))}
        else:
            groups = {}
            for j, s in enumerate(ready):
                groups.setdefault(s.data.residual, []).append(j)
        # every row steps and reads the last decode step's states in place: the code predictor
        # takes that output buffer as it is (on a GPU it never leaves the device)
        in_place = (len(groups) == 1 and last is not None and len(ready) == last.rows
                    and ready[-1].row == len(ready) - 1
                    and all(s.data.hidden is None for s in ready))  # fmt: skip
        cp_s = 0.0
        for params, js in groups.items():  # one code predictor call per residual setting
            part = [ready[j] for j in js]
            session = self._cp_session(len(part))
            code0 = np.array([s.generated[-1] for s in part], np.int64)
            hidden = (last.buffer("last_hidden") if in_place
                      else np.stack([self._hidden(s, last) for s in part]))  # fmt: skip
            t0, e0 = time.perf_counter(), session.engine_seconds
            got, embed, redrawn = self.cp.frame(
                session, hidden, code0, self.codec_embedding[code0],
                np.ones(len(part), bool), params, [s.rng for s in part],
            )  # fmt: skip
            spent, engine = time.perf_counter() - t0, session.engine_seconds - e0
            cp_s += spent
            codes[js], frame_embed[js] = got, embed
            for s in part:
                s.data.cp_s += spent
                s.data.cp_engine_s += engine
                s.data.host_frames += int(redrawn)
        text = self._text_rows([s.data.prefill for s in ready], [s.steps for s in ready],
                               np.ones(len(ready), bool))  # fmt: skip
        stepping = {s.row for s in ready}
        for s in slots.values():  # rows sitting out keep their state: the call overwrites it
            if s.data.hidden is None and s.row not in stepping:
                self._hidden(s, last)
        for j, s in enumerate(ready):
            speech = s.data
            if speech.frames is None:
                speech.frames = np.empty((max(speech.max_frames, 1), self.groups), np.int64)
            speech.frames[speech.made] = codes[j]
            speech.made += 1
            speech.cp_steps_s += cp_s
        return frame_embed + text

    def decode_feeds(self, rows: int) -> dict[str, Any]:
        return {}

    def stepped(self, ready: Sequence[Slot]) -> None:
        for s in ready:
            s.data.hidden = None  # in this call's output, read when needed

    def banned(self, slot: Slot) -> np.ndarray:
        """The codec's control band; the end of speech too before min_new_tokens."""
        if len(slot.generated) < slot.data.min_frames:
            return self._suppressed_and_eos
        return self.suppressed

    def finished(self, slot: Slot) -> str | None:
        """At the end of speech, or its frame limit."""
        if slot.generated[-1] == self.ids["codec_eos"]:
            return "eos"
        return "length" if len(slot.generated) >= slot.data.max_frames else None

    def events(self, slot: Slot) -> list[Event]:
        """Its new frames (an utterance of no frames still gives one empty event: its codes
        are empty, not absent)."""
        speech = slot.data
        if not (speech.made > speech.sent or (slot.finish is not None and not speech.made)):
            return []
        new = (speech.frames[speech.sent : speech.made].copy() if speech.frames is not None
               else np.zeros((0, self.groups), np.int64))  # fmt: skip
        speech.sent = speech.made
        return [CodecFrames(slot.state.index, self.stage_id, new)]

    def move(self, slot: Slot, last: Any) -> None:
        self._hidden(slot, last)  # its state to the host first: it was found by its row

    def retire(self, slot: Slot) -> None:
        """A finished request's codes and report."""
        state, speech = slot.state, slot.data
        codes = (np.zeros((0, self.groups), np.int64) if speech.frames is None
                 else speech.frames[: speech.made].copy())  # fmt: skip
        state.outputs[f"{self.stage_id}:codes"] = codes
        talker_s = slot.prefill_s + slot.decode_s - speech.cp_steps_s
        state.details[self.stage_id] = {
            "frames": len(codes),
            "finish_reason": slot.finish,
            "voice": self.voice_of(state),
            "talker_ms": round(talker_s * 1e3, 3),
            "code_predictor_ms": round(speech.cp_s * 1e3, 3),
            "talker_engine_ms": round((slot.prefill_engine_s + slot.decode_engine_s) * 1e3, 3),
            # drawing in the engine, calls are queued, not waited for: then this is the time to
            # queue them, and the GPU's time is in code_predictor_ms
            "code_predictor_engine_ms": round(speech.cp_engine_s * 1e3, 3),
            "code_predictor_draws": "engine" if self.cp.draws_in_engine(speech.residual)
            else "host",
            "code_predictor_host_frames": speech.host_frames,
            "cohort_size": slot.widest,
            "full_logit_rows": slot.full_rows,
        }


class Talker(SpeechTalker):
    """Qwen3-Omni's talker: its prefill is read from the thinker's handoff (user turns, the
    assistant prefix with the speaker's codec rows, then the reply as the thinker writes it)."""

    def setup(self, folder: Path, cfg: dict[str, Any]) -> None:
        tables = safetensors_np.load(folder / "projections.safetensors")
        self.text_projection = _projection(tables, "text_projection")
        self.hidden_projection = _projection(tables, "hidden_projection")
        bos, eos, pad = self.text_projection(np.asarray(tables["tts_special"], np.float32))
        self.tts_bos, self.tts_eos, self.tts_pad = bos, eos, pad
        self.speakers: dict[str, int] = cfg["speakers"]
        self.default_speaker: str = cfg["default_speaker"]
        self.mrope_ids = MropeIds(**cfg["mrope_ids"])
        self.tts_pad_token = int(cfg["tts_pad_token_id"])

    consumes = True  # its thinker's HiddenRows and Finished

    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        """Done by the thinker; streamed, also once the reply's first token is fed."""
        if upstream_done or not self.stream:
            return upstream_done
        first = next((e for e in events if isinstance(e, HiddenRows)), None)
        if first is None or first.prompt is None:
            return False
        need = self.speaking_start(first.prompt.ids)
        fed = sum(len(e.rows) for e in events if isinstance(e, HiddenRows))
        return need is None or fed >= need

    def consume(self, slot: Slot, event: Event) -> None:
        """The thinker's rows as it feeds them, then its end."""
        slot.data.prefill.handoff.take(event)

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Checked:
        """What opening this stage reads, without loading an engine: its config and tables, its
        speakers, the code predictor's folder, and the stage's hidden-state input."""
        stage_source(stage, "hidden")
        checked = check_folder(folder, ARTIFACT)
        cfg, path = checked.config, folder / CONFIG
        unknown = sorted(set(cfg["mrope_ids"]) - set(MropeIds.__dataclass_fields__))
        if unknown:
            raise ArtifactError(path, f"mrope_ids has unknown keys {unknown}")
        if cfg["default_speaker"] not in cfg["speakers"]:
            raise ArtifactError(
                path, f"default_speaker {cfg['default_speaker']!r} is not among its speakers"
            )
        check_folder(
            (folder / cfg["code_predictor"]).resolve(), cp_artifact(cfg["num_code_groups"])
        )
        return checked

    # -- per request -------------------------------------------------------------------------
    def prepare(self, state: RequestState) -> str:
        """The speaker this request speaks with (checked before any cohort runs)."""
        voice = (state.request.voice or self.default_speaker).lower()
        if voice not in self.speakers:
            raise RequestError(
                f"unknown voice {state.request.voice!r}; this model's voices are "
                f"{', '.join(sorted(self.speakers))}"
            )
        return voice

    def _plan(self, state: RequestState, events: Sequence[Event]) -> _Plan:
        """What a request's prefill reads from its thinker's rows so far, not yet projected."""
        th = ThinkerRows.of(events)
        if th is None:
            raise RequestError("no hidden rows came from the thinker")
        prompt, hidden, prompt_len = th.prompt_ids, th.prompt.hidden, th.prompt_len
        ids_ = self.ids
        # user turns: a position belongs to the turn opened by the latest <|im_start|> before it
        starts = np.where(prompt == ids_["im_start"], np.arange(prompt_len), -1)
        latest = np.maximum.accumulate(starts).clip(min=0)
        roles = prompt[np.minimum(latest + 1, prompt_len - 1)]
        user = np.flatnonzero(roles == ids_["user"])
        media = np.isin(prompt[user], [ids_["audio"], ids_["image"], ids_["video"]])
        if media.any() and hidden is None:  # the thinker keeps hidden states for media prompts
            raise RequestError("the prompt has media placeholder tokens but no audio or image")
        # the assistant turn: from the last "<|im_start|>assistant" on. The fed tokens are the
        # prompt and the reply but its last: the prefill reads the "<|im_start|>assistant\n"
        # rows and the reply's first token
        need = self.speaking_start(prompt)
        if need is None:
            raise RequestError("the prompt has no assistant turn for the talker to speak")
        begin = need - 4
        if th.fed < begin + 4:
            raise RequestError("the thinker wrote no text for the talker to speak")
        return _Plan(
            state, th, user, media,
            th.embeds(0, prompt_len)[user[~media]],
            hidden[user[media]] if media.any() else None,
            begin,
            th.embeds(begin, th.fed),  # every reply token fed so far; later ones as they come
        )  # fmt: skip

    def _prefills(self, plans: Sequence[_Plan]) -> list[_Prefill]:
        """The cohort's prefill rows. Every request's text rows (user turns, reply so far) go
        through text_projection in one call, media rows through hidden_projection in another:
        a call per request read the projection's weights (25 MB at real dimensions) again each
        time, ~3.5x the time of one call at 32 requests on a 2-core CPU, and the first audio
        waits for it."""
        text = _split(self.text_projection, [x for p in plans for x in (p.user_text, p.reply)])
        medias = [p.media for p in plans if p.media is not None]
        media = iter(_split(self.hidden_projection, medias))
        ids_ = self.ids
        codec_ids = [ids_[k] for k in ("codec_nothink", "codec_think_bos", "codec_think_eos")]
        out = []
        for i, plan in enumerate(plans):
            user_rows = np.empty((len(plan.user), self.hidden_size), np.float32)
            if plan.media is not None:
                user_rows[plan.user_media] = next(media)
            user_rows[~plan.user_media] = text[2 * i]
            reply = text[2 * i + 1]
            speaker = self.speakers[plan.state.prepared[self.stage.id]]
            text_track = np.stack([*reply[:3], *[self.tts_pad] * 4, self.tts_bos, reply[3]])
            codec_track = np.concatenate([
                np.zeros((3, self.hidden_size), np.float32),
                self.codec_embedding[[*codec_ids, speaker, ids_["codec_pad"], ids_["codec_bos"]]],
            ])  # fmt: skip
            th = plan.handoff
            prefill = _Prefill(
                np.concatenate([user_rows, text_track + codec_track]), th, plan.begin, reply
            )
            if th.prompt.image_grids:  # transformers' talker positions: ids and the grids
                talker_ids = np.concatenate(
                    [th.prompt_ids[plan.user], np.full(len(text_track), self.tts_pad_token)]
                )
                prefill.positions, prefill.delta = rope_index(
                    talker_ids.tolist(),
                    self.mrope_ids,
                    image_grids=th.prompt.image_grids,
                    audio_mel_frames=th.prompt.audio_frames or (),
                )
            out.append(prefill)
        return out

    def speaking_start(self, prompt: np.ndarray) -> int | None:
        """How many fed tokens the prefill reads, up to the reply's first token (from the last
        "<|im_start|>assistant" on); None when the prompt has no assistant turn."""
        ids_ = self.ids
        starts = np.flatnonzero(
            (prompt[:-1] == ids_["im_start"]) & (prompt[1:] == ids_["assistant"])
        )
        return int(starts[-1]) + 4 if len(starts) else None

    def _text_rows(
        self,
        prefills: Sequence[_Prefill],
        steps: Sequence[int],
        active: np.ndarray,
    ) -> np.ndarray:
        """Each row's text input for its decode step ``steps[row]``: the reply's next fed token
        through text_projection, then tts_eos once, then tts_pad (a finished row: tts_pad).
        Streamed, the tokens the thinker fed since the last projection are projected when first
        needed, every row's in one call (the projection reads its weights once per call)."""
        rows = np.broadcast_to(self.tts_pad, (len(prefills), self.hidden_size)).copy()
        index = {}  # row -> its token within the reply, for the rows still speaking
        for row, p in enumerate(prefills):
            if active[row]:
                index[row] = p.trailing_index(steps[row])
        stale = [
            prefills[r] for r, j in index.items() if len(prefills[r].reply) <= j < prefills[r].fed
        ]
        if stale:  # only while streaming: a finished thinker's reply was projected whole
            new = [p.unprojected() for p in stale]
            done = np.split(self.text_projection(np.concatenate(new)),
                            np.cumsum([len(x) for x in new])[:-1])  # fmt: skip
            for p, more in zip(stale, done, strict=True):
                p.reply = np.concatenate([p.reply, more])
        for row, j in index.items():
            p = prefills[row]
            if j < p.fed:
                rows[row] = p.reply[j]
            elif j == p.fed:
                rows[row] = self.tts_eos
        return rows
