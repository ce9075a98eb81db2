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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import CONFIG, Artifact, ArtifactError, Checked, check_folder
from edgeomni.runtime.decoder_stage import Slot
from edgeomni.runtime.events import Event, Finished, HiddenRows
from edgeomni.runtime.families.qwen3_omni.media import MEDIA_TOKENS
from edgeomni.runtime.media.mrope import MropeIds, rope_index
from edgeomni.runtime.prompt import PromptRows
from edgeomni.runtime.speech.code_predictor import cp_artifact
from edgeomni.runtime.speech.keys import PREFIXES, STAGE_KEYS
from edgeomni.runtime.speech.talker import SpeechTalker
from edgeomni.runtime.stage import RequestError, RequestState, stage_source

# transformers' Qwen3-Omni talker and code predictor settings (``SpeechTalker._sampling``)
SAMPLING = MappingProxyType({
    "do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0,
    "repetition_penalty": 1.05, "max_new_tokens": 4096, "min_new_tokens": 0,
})  # fmt: skip
CP_SAMPLING = MappingProxyType({"dosample": True, "temperature": 1.0, "top_k": 50, "top_p": 0.8})


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
        "num_code_groups", "vocab_size", "state", "hidden_size", "num_hidden_layers",
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
    reads = frozenset((*SpeechTalker.reads, *STAGE_KEYS))
    follows_talker = True  # transformers': greedy residual codes under a greedy talker

    prefixes = PREFIXES

    def sampling_defaults(self) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        return SAMPLING, CP_SAMPLING

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
        prompt, hidden = th.prompt.ids, th.prompt.hidden
        prompt_len = len(prompt)
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
                    [th.prompt.ids[plan.user], np.full(len(text_track), self.tts_pad_token)]
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
