"""qwen3_omni.talker: the thinker's reply in, codec frames [frames, 16] out.

The talker and its code predictor step the cohort together, one codec frame at a time: the talker
gives each row's first code, the code predictor completes the frame's residual codes (one head
per group), and the sum of the frame's code embeddings plus the next text row is the talker's
next input. The prefill is assembled here as transformers' Qwen3-Omni ``generate`` does: the user
turns (text rows through text_projection, audio/image rows through hidden_projection of the
thinker's accept-layer state), then the assistant prefix with the speaker's codec rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import CONFIG, Artifact, ArtifactError, Checked, check_folder
from edgeomni.runtime.decoder import TOPK_OUTPUTS, DecoderSession, right_pad, text_positions
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.families.qwen3_omni import STAGE_KEYS
from edgeomni.runtime.families.qwen3_omni.code_predictor import CodePredictor, cp_artifact
from edgeomni.runtime.families.qwen3_omni.media import MEDIA_TOKENS
from edgeomni.runtime.families.qwen3_omni.mrope import MropeIds, rope_index
from edgeomni.runtime.kv import KVCache
from edgeomni.runtime.requests import SPEECH_STAGE_KEYS
from edgeomni.runtime.runners import (
    HiddenHandoff,
    RequestError,
    RequestState,
    StageRunner,
    stage_source,
)
from edgeomni.runtime.sampling import SamplingParams, sample_step

DEFAULT_MAX_FRAMES = 4096  # transformers' talker_max_new_tokens


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
class _Prefill:
    embeds: np.ndarray  # [L, H]
    handoff: HiddenHandoff
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
    handoff: HiddenHandoff
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


# A thinker step to wait for: advances the upstream stage by one step and says whether it ran
# (False: the upstream stage has finished every request).
Upstream = Callable[[], bool]


def _wait(handoff: HiddenHandoff, fed: int, upstream: Upstream | None) -> None:
    """Until the thinker has fed ``fed`` tokens of this request or finished it."""
    while not (handoff.done or handoff.fed >= fed):
        # a step may finish the thinker and this request with it, so look again before failing
        ran = upstream is not None and upstream()
        if not ran and not (handoff.done or handoff.fed >= fed):
            raise RuntimeError("the thinker stopped before finishing a request it feeds")


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


class SpeechTalker(StageRunner):
    """The talker loop both Qwen3 speech families share: the talker engine gives each frame's
    first code, the code predictor its residual codes, and the frame's summed embedding plus the
    next text row is the talker's next input. A family's subclass builds the prefill and text
    rows (``_plan``, ``_prefills``, ``_text_rows``), reads its settings (``_sampling``) and says
    when a request can start (``slot_ready``); ``setup`` reads its own tables."""

    kind = "autoregressive"
    # the talker's keys; the request's seed seeds it when talker_seed is not given
    reads = frozenset((*SPEECH_STAGE_KEYS, "seed", "sampling_seed", *STAGE_KEYS))
    feeds_sinks = True  # each frame goes to the vocoder as it is made
    mrope = True  # the talker engine takes 3-axis positions (Qwen3-Omni); False: 1-D

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
        cfg = self.config = self.check(stage, folder).config
        self.engine = engines.open(folder, cfg, spin=False)
        self.codec_embedding = safetensors_np.load(folder / "embedding.safetensors")["embedding"]
        self.groups = int(cfg["num_code_groups"])
        self.ids: dict[str, int] = cfg["ids"]
        self.vocab_size = int(cfg["vocab_size"])
        self.hidden_size = int(cfg["hidden_size"])
        limits = cfg["builder_config"]
        self.max_batch = int(limits["max_batch_size"])
        self.capacity = int(limits["max_kv_cache_capacity"])
        self.kv = KVCache.for_decoder(cfg, self.max_batch, self.capacity, self.engine)
        self.cp = CodePredictor(
            (folder / cfg["code_predictor"]).resolve(), groups=self.groups,
            max_batch=self.max_batch, engines=engines,
        )  # fmt: skip
        # the talker may not emit the codec's control band, except the end of speech (a GPU
        # build's engine keeps the same band out of its top-K)
        band = np.arange(max(0, self.vocab_size - 1024), self.vocab_size)
        self.suppressed = band[band != self.ids["codec_eos"]]
        self._suppressed_and_eos = np.append(self.suppressed, self.ids["codec_eos"])
        self.setup(folder, cfg)

    def setup(self, folder: Path, cfg: dict[str, Any]) -> None:
        """The family's own tables and settings, read once the engines are open."""

    def voice_of(self, state: RequestState) -> Any:
        """What a request's report says it spoke with."""
        return state.prepared[self.stage.id]

    def slot_ready(self, state: RequestState, upstream_done: bool, stream: bool) -> bool:
        """Whether the in-flight scheduler may start this request here now."""
        return upstream_done

    def slot_stage(self, *, stream_upstream: bool = False) -> Any:
        """This stage for the in-flight scheduler; ``stream_upstream``: a request starts once
        its reply's first token is fed, not once the thinker is done with it."""
        from edgeomni.runtime.families.qwen3_omni.talker_slots import TalkerSlots

        return TalkerSlots(self, stream=stream_upstream)

    # -- per cohort --------------------------------------------------------------------------
    def run(
        self,
        cohort: Sequence[RequestState],
        sinks: Mapping[int, Callable[[np.ndarray], None]] | None = None,
        upstream: Upstream | None = None,
    ) -> None:
        """``sinks``: request index -> a callable fed each new frame [1, G] as it is made (the
        vocoder downstream, so audio is made while the talker runs); a sink's ``end_step()``, if
        it has one, is called once every row of a frame is fed. ``upstream``: the thinker is
        still decoding this cohort; each call runs one of its steps (the talker starts once every
        request's reply has its first token, and reads later tokens as they come). Without it
        the thinker's handoffs must be complete."""
        sinks = sinks or {}
        waited = [0.0]  # seconds spent running the thinker's steps from here

        def timed() -> bool:
            t = time.perf_counter()
            try:
                return upstream() if upstream is not None else False
            finally:
                waited[0] += time.perf_counter() - t

        advance = timed if upstream is not None else None
        plans = []
        for state in cohort:
            try:
                plans.append(self._plan(state, advance))
            except RequestError as e:
                state.error = f"{self.stage.id}: {e}"
        cohort = [s for s in cohort if s.error is None]
        if not cohort:
            return
        prefills = self._prefills(plans)
        n = len(cohort)
        talker_params, cp_params, max_frames, min_frames = self._sampling(cohort[0].request)
        # each row its own generator (the cohort shares the seed): a request's codes depend on
        # its seed and inputs, not on the rows beside it
        rng = [np.random.default_rng(talker_params.seed) for _ in range(n)]
        lens = np.array([len(p.embeds) for p in prefills], np.int32)
        if int(lens.max()) + max_frames > self.capacity:
            max_frames = self.capacity - int(lens.max())
        session = DecoderSession(
            self.engine,
            self.kv,
            n,
            {"logits": (self.vocab_size,), "last_hidden": (self.hidden_size,)},
        )
        cp_session = self.cp.session(n)
        host_frames = 0  # frames the engine was to draw but could not, drawn on the host
        embeds = right_pad([p.embeds for p in prefills])
        zeros = np.zeros(n, np.int32)
        positions = text_positions(zeros, embeds.shape[1], self.mrope)
        for row, p in enumerate(prefills):
            if p.positions is not None:
                positions[:, row, : len(p.embeds)] = p.positions
        deltas = np.array([p.delta for p in prefills], np.int32)
        start = time.perf_counter()
        waited_at_start = waited[0]
        out = session.run(embeds, positions, zeros, lens, lens - 1)
        # each row's sampled first codes: one array, so a step's repetition-penalty input is
        # views, not a list of every row's codes made into arrays again (~110 us a step at
        # 32 rows and 100 frames, growing with the frames)
        first = np.zeros((n, max(max_frames, 1)), np.int64)
        count = np.zeros(n, np.int64)
        frames: list[list[np.ndarray]] = [[] for _ in range(n)]
        finish: list[str | None] = [None] * n
        past = lens.copy()
        step = 0
        cp_ms = 0.0
        vocoder_ms = 0.0  # windows vocoded downstream while this loop waits
        full_rows = 0  # rows whose full logits had to come to the host
        while True:
            seen = [first[r, : count[r]] for r in range(n)]
            banned = [
                self._suppressed_and_eos if count[r] < min_frames else self.suppressed
                for r in range(n)
            ]
            # what the host reads, in one sync; split, the hidden state goes to the code
            # predictor where it is
            wanted = TOPK_OUTPUTS if self.cp.split_prefill else ("last_hidden", *TOPK_OUTPUTS)
            out.fetch(*wanted)
            code0, fetched = sample_step(out.logits(), talker_params, rng, seen, banned)
            full_rows += fetched
            for row in range(n):
                if finish[row] is None:
                    first[row, count[row]] = code0[row]
                    count[row] += 1
                    if code0[row] == self.ids["codec_eos"]:
                        finish[row] = "eos"
                    elif count[row] >= max_frames:
                        finish[row] = "length"
            active = np.array([f is None for f in finish])
            if not active.any():
                break
            t = time.perf_counter()
            hidden = out.buffer("last_hidden") if self.cp.split_prefill else out["last_hidden"]
            e0 = self.codec_embedding[code0]
            codes, frame_embed, redrawn = self.cp.frame(
                cp_session, hidden, code0, e0, active, cp_params, rng
            )
            host_frames += redrawn
            cp_ms += (time.perf_counter() - t) * 1e3
            nxt = frame_embed + self._text_rows(prefills, [step] * n, active, advance)
            for row in range(n):
                if active[row]:
                    frames[row].append(codes[row])
                    sink = sinks.get(cohort[row].index)
                    if sink is not None:
                        sink(codes[row][None])
            t = time.perf_counter()
            for sink in {id(s): s for s in sinks.values()}.values():  # every row fed: vocode
                end_step = getattr(sink, "end_step", None)
                if end_step is not None:
                    end_step()
            vocoder_ms += (time.perf_counter() - t) * 1e3
            out = session.run(
                nxt[:, None, :],
                text_positions(past + deltas, 1, self.mrope),
                past,
                active.astype(np.int32),
                np.zeros(n, np.int64),
            )
            past = past + active.astype(np.int32)
            step += 1
        total_ms = (time.perf_counter() - start - (waited[0] - waited_at_start)) * 1e3
        for row, state in enumerate(cohort):
            codes = np.array(frames[row], np.int64).reshape(-1, self.groups)
            state.outputs[f"{self.stage.id}:codes"] = codes
            state.details[self.stage.id] = {
                "frames": len(codes),
                "finish_reason": finish[row],
                "voice": self.voice_of(state),
                "talker_ms": round(total_ms - cp_ms - vocoder_ms, 3),
                "code_predictor_ms": round(cp_ms, 3),
                "streamed_vocoder_ms": round(vocoder_ms, 3),
                # the thinker's steps run from this loop while it streamed its reply
                "thinker_steps_ms": round(waited[0] * 1e3, 3),
                # inside engine calls; the rest of the two above is host work (and the vocoder)
                "talker_engine_ms": round(session.engine_seconds * 1e3, 3),
                # drawing in the engine, calls are queued, not waited for: then this is the
                # time to queue them, and the GPU's time is in code_predictor_ms
                "code_predictor_engine_ms": round(cp_session.engine_seconds * 1e3, 3),
                "code_predictor_draws": "engine" if self.cp.draws_in_engine(cp_params) else "host",
                "code_predictor_host_frames": host_frames,
                "cohort_size": n,
                "full_logit_rows": full_rows,
            }


class Talker(SpeechTalker):
    """Qwen3-Omni's talker: its prefill is read from the thinker's handoff (user turns, the
    assistant prefix with the speaker's codec rows, then the reply as the thinker writes it)."""

    reads_upstream = True  # run() takes the thinker's steps as ``upstream`` (stage streaming)

    def setup(self, folder: Path, cfg: dict[str, Any]) -> None:
        tables = safetensors_np.load(folder / "projections.safetensors")
        self.text_projection = _projection(tables, "text_projection")
        self.hidden_projection = _projection(tables, "hidden_projection")
        bos, eos, pad = self.text_projection(np.asarray(tables["tts_special"], np.float32))
        self.tts_bos, self.tts_eos, self.tts_pad = bos, eos, pad
        self.speakers: dict[str, int] = cfg["speakers"]
        self.default_speaker: str = cfg["default_speaker"]
        self.hidden_source = self._source("hidden")
        self.mrope_ids = MropeIds(**cfg["mrope_ids"])
        self.tts_pad_token = int(cfg["tts_pad_token_id"])

    def slot_ready(self, state: RequestState, upstream_done: bool, stream: bool) -> bool:
        """Done by the thinker; streamed, also once the reply's first token is fed."""
        if upstream_done or not stream:
            return upstream_done
        handoff = state.outputs.get(self.hidden_source)
        if handoff is None:
            return False
        need = self.speaking_start(handoff)
        return need is None or handoff.done or handoff.fed >= need

    def _source(self, name: str) -> str:
        return stage_source(self.stage, name)

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

    def _plan(self, state: RequestState, upstream: Upstream | None) -> _Plan:
        """What a request's prefill reads from its thinker handoff, not yet projected."""
        th: HiddenHandoff = state.outputs[self.hidden_source]
        prompt, hidden, prompt_len = th.prompt_ids, th.hidden, th.prompt_len
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
        need = self.speaking_start(th)
        if need is None:
            raise RequestError("the prompt has no assistant turn for the talker to speak")
        begin = need - 4
        _wait(th, need, upstream)
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
            if th.image_grids:  # transformers' talker positions: its input ids and the grids
                talker_ids = np.concatenate(
                    [th.prompt_ids[plan.user], np.full(len(text_track), self.tts_pad_token)]
                )
                prefill.positions, prefill.delta = rope_index(
                    talker_ids.tolist(),
                    self.mrope_ids,
                    image_grids=th.image_grids,
                    audio_mel_frames=th.audio_frames or (),
                )
            out.append(prefill)
        return out

    def speaking_start(self, handoff: HiddenHandoff) -> int | None:
        """How many fed tokens the prefill reads, up to the reply's first token (from the last
        "<|im_start|>assistant" on); None when the prompt has no assistant turn."""
        prompt, ids_ = handoff.prompt_ids, self.ids
        starts = np.flatnonzero(
            (prompt[:-1] == ids_["im_start"]) & (prompt[1:] == ids_["assistant"])
        )
        return int(starts[-1]) + 4 if len(starts) else None

    def _text_rows(
        self,
        prefills: Sequence[_Prefill],
        steps: Sequence[int],
        active: np.ndarray,
        upstream: Upstream | None,
    ) -> np.ndarray:
        """Each row's text input for its decode step ``steps[row]``: the reply's next fed token
        through text_projection, then tts_eos once, then tts_pad (a finished row: tts_pad).
        Streamed, the tokens the thinker fed since the last projection are projected when first
        needed, every row's in one call (the projection reads its weights once per call)."""
        rows = np.broadcast_to(self.tts_pad, (len(prefills), self.hidden_size)).copy()
        index = {}  # row -> its token within the reply, for the rows still speaking
        for row, p in enumerate(prefills):
            if active[row]:
                index[row] = j = p.trailing_index(steps[row])
                _wait(p.handoff, p.reply_start + j + 1, upstream)
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

    def _sampling(self, request: Any) -> tuple[SamplingParams, SamplingParams, int, int]:
        """talker_* keys for the first code, cp_* (or subtalker_*) keys for the residual codes.

        The residual codes follow the talker: greedy when it is greedy, otherwise transformers'
        top_k 50 / top_p 0.8 unless cp_* keys say otherwise."""
        extra = dict(request.extra_sampling)
        sample = bool(extra.get("talker_do_sample", True))  # false: greedy, as upstream's
        talker = SamplingParams(
            temperature=float(extra.get("talker_temperature", 0.9)) if sample else 0.0,
            top_k=int(extra.get("talker_top_k", 50)),
            top_p=float(extra.get("talker_top_p", 1.0)),
            repetition_penalty=float(extra.get("talker_repetition_penalty", 1.05)),
            seed=extra.get("talker_seed", extra.get("talker_sampling_seed", request.sampling.seed)),
        )

        def cp(key: str, default: float) -> float:
            return extra.get(f"cp_{key}", extra.get(f"subtalker_{key}", default))

        cp_sample = bool(extra.get("cp_dosample", extra.get("subtalker_dosample", True)))
        cp_given = any(k.startswith(("cp_", "subtalker_")) for k in extra)
        if not cp_sample or (talker.greedy and not cp_given):
            residual = SamplingParams(temperature=0.0, top_k=1, top_p=1.0)
        else:
            residual = SamplingParams(
                temperature=float(cp("temperature", 1.0)),
                top_k=int(cp("top_k", 50)),
                top_p=float(cp("top_p", 0.8)),
            )
        return (
            talker,
            residual,
            int(extra.get("talker_max_new_tokens", DEFAULT_MAX_FRAMES)),
            int(extra.get("talker_min_new_tokens", 0)),
        )
