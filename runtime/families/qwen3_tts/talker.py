"""qwen3_tts.talker: the request's text in, codec frames [frames, 16] out.

The prompt is built as qwen-tts 0.1.1's ``Qwen3TTSForConditionalGeneration.generate`` builds it
(families.md §1): an optional instruction turn, the role, the codec prefix (language or
auto, a dialect speaker's own language id, the speaker's codec row), then the text, either
streamed (its first token in the prefill, the rest fed one per frame, then tts_eos) or whole in
the prefill (each token over codec_pad, then tts_pad over codec_bos). Text rows are looked up in
the talker folder's text table, already through text_projection at build time. The decoding
loop and the code predictor are the shared speech talker's (runtime/speech/talker.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.artifacts import CONFIG, Artifact, ArtifactError, Checked, check_folder
from edgeomni.runtime.families.qwen3_tts import FAMILY, STAGE_KEYS
from edgeomni.runtime.speech.code_predictor import cp_artifact
from edgeomni.runtime.speech.talker import SpeechTalker
from edgeomni.runtime.stage import RequestError, RequestState

__all__ = ["TtsTalker", "spoken_text"]

CP = "subtalker_"  # generation_config.json's prefix of the code predictor's settings

ARTIFACT = Artifact(
    keys=(
        "num_code_groups", "vocab_size", "state", "hidden_size", "num_hidden_layers",
        "num_key_value_heads", "head_dim", "code_predictor", "tts_model_type", "tts_model_size",
        "languages", "speakers", "dialects", "generation", "min_new_tokens",
        "builder_config.max_batch_size", "builder_config.max_input_len",
        "builder_config.max_kv_cache_capacity",
        *(f"ids.{k}" for k in ("tts_bos", "tts_eos", "tts_pad", "codec_pad", "codec_bos",
                               "codec_eos", "codec_think", "codec_nothink", "codec_think_bos",
                               "codec_think_eos")),
    ),
    tables={"embedding.safetensors": ("embedding",), "text_embedding.safetensors": ("embedding",)},
    tokenizer=True,
)  # fmt: skip

AUTO = "auto"
# the wrapper's text modes: upstream's generate_custom_voice and generate_voice_design default to
# the whole text in the prefill, generate_voice_clone to streamed text
NON_STREAMING_DEFAULT = {"custom_voice": True, "voice_design": True, "base": False}


def spoken_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text to speak: the last assistant message's (qwen3_tts_inference's requests), or,
    in a request with none, the last user message's (what ``--prompt`` gives)."""
    for role in ("assistant", "user"):
        found = [m for m in messages if m.get("role") == role]
        if not found:
            continue
        content = found[-1]["content"]
        if isinstance(content, str):
            return content
        kinds = sorted({p["type"] for p in content} - {"text"})
        if kinds:
            raise RequestError(f"Qwen3-TTS speaks text only; the message holds {', '.join(kinds)}")
        return "".join(p["text"] for p in content)
    raise RequestError("the request has no assistant (or user) message to speak")


@dataclass(frozen=True)
class Spoken:
    """What a request asks the talker to say, checked and tokenized when it is prepared (the
    rows are made when it starts: a cloned voice's inputs come from the encoder stages)."""

    voice: str | None  # the CustomVoice speaker, None otherwise
    language: str
    ids: tuple[int, ...]  # the assistant turn, upstream's template
    instruct: tuple[int, ...] | None  # the instruction turn
    ref: tuple[int, ...] | None  # an ICL prompt's transcript (Base)
    clone: bool  # Base: the voice is the request's ref_audio
    non_streaming: bool


@dataclass
class Utterance:
    """One request's prompt rows, as the shared talker loop reads a prefill."""

    state: RequestState
    voice: str | None
    embeds: np.ndarray  # the prefill [L, H]
    trailing: np.ndarray  # the text rows fed one per frame, then tts_pad [T, H]

    # the cohort loop's and slot stage's view of a prefill (Omni's _Prefill has the same)
    positions: None = None
    delta: int = 0

    def can_step(self, step: int) -> bool:
        return True  # every text row is known up front


def _optional_source(stage: Any, name: str) -> str | None:
    return next((i.source for i in stage.inputs if i.name == name), None)


class TtsTalker(SpeechTalker):
    """Qwen3-TTS's talker: a graph's first stage, so a request starts as soon as it has a row."""

    mrope = False  # 1-D positions: the release's MRoPE gives every section the same ones
    follows_talker = False  # upstream's talker and code predictor do not share settings
    # with no text model, repetition_penalty is the talker's (see Pipeline._as_read)
    reads = frozenset((*SpeechTalker.reads, *STAGE_KEYS, "repetition_penalty"))
    prefixes = FAMILY.stage_prefixes

    def setup(self, folder: Path, cfg: dict[str, Any]) -> None:
        from edgeomni.runtime.tokenizer import TextTokenizer

        self.tokenizer = TextTokenizer(folder)
        self.text_table = safetensors_np.load(folder / "text_embedding.safetensors")["embedding"]
        ids = self.ids
        self.tts_bos, self.tts_eos, self.tts_pad = (
            np.asarray(self.text_table[ids[k]], np.float32)
            for k in ("tts_bos", "tts_eos", "tts_pad")
        )
        self.model_type: str = cfg["tts_model_type"]
        self.model_size: str = cfg["tts_model_size"]
        self.speakers: dict[str, int] = cfg["speakers"]
        self.languages: dict[str, int] = cfg["languages"]
        self.dialects: dict[str, str] = cfg["dialects"]
        # the checkpoint's generation_config.json: the talker's settings and the code
        # predictor's (its subtalker_* keys), split once
        gen: dict[str, Any] = cfg["generation"]
        talker = {k: v for k, v in gen.items() if not k.startswith(CP)}
        self._defaults = (
            {**talker, "min_new_tokens": int(cfg["min_new_tokens"])},
            {k.removeprefix(CP): v for k, v in gen.items() if k.startswith(CP)},
        )
        self.max_input_len = int(cfg["builder_config"]["max_input_len"])
        # a Base graph's clone inputs (None: not in this graph)
        self.xvector_source = _optional_source(self.stage, "xvector")
        self.ref_codes_source = _optional_source(self.stage, "ref_codes")

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Checked:
        """What opening this stage reads, without loading an engine: its config, tables and
        tokenizer, its speakers and languages, and the code predictor's folder."""
        checked = check_folder(folder, ARTIFACT)
        cfg, path = checked.config, folder / CONFIG
        if cfg["tts_model_type"] not in NON_STREAMING_DEFAULT:
            raise ArtifactError(path, f"tts_model_type {cfg['tts_model_type']!r} is unknown")
        for speaker, dialect in cfg["dialects"].items():
            if dialect not in cfg["languages"]:
                raise ArtifactError(path, f"the dialect of {speaker}, {dialect!r}, is no language")
        check_folder(
            (folder / cfg["code_predictor"]).resolve(), cp_artifact(cfg["num_code_groups"])
        )
        return checked

    def sampling_defaults(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self._defaults

    def voice_of(self, state: RequestState) -> Any:
        spoken = state.prepared[self.stage.id]
        return "ref_audio" if spoken.clone else spoken.voice

    # -- per request -------------------------------------------------------------------------
    def prepare(self, state: RequestState) -> Spoken:
        """The request's text and controls, checked and tokenized; a RequestError for a voice,
        language or control this checkpoint does not take (upstream raises for the same, or
        drops the control)."""
        request = state.request
        text = spoken_text(request.messages)
        if not text:
            raise RequestError("the text to speak is empty")
        speech = request.speech
        voice = self._voice(request.voice)
        language = self._language(speech.get("language"))
        instruct = speech.get("instruct")
        if instruct is not None and not self._takes_instruct():
            raise RequestError(
                f"instruct: this {self.model_type} checkpoint ({self.model_size}) takes no "
                f"instruction"
            )
        clone = self.model_type == "base"
        ref_text = speech.get("ref_text")
        if clone and "ref_audio" not in speech:
            raise RequestError(
                "a Base checkpoint clones the voice of ref_audio (with ref_text, its "
                "transcript, for an in-context prompt): the request has no ref_audio"
            )
        encode = self.tokenizer.encode
        ids = tuple(encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"))
        ref = (
            tuple(encode(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")[3:-2])
            if ref_text
            else None
        )
        spoken = Spoken(
            voice, language, ids,
            tuple(encode(f"<|im_start|>user\n{instruct}<|im_end|>\n")) if instruct else None,
            ref, clone,
            bool(request.stage_settings.get("talker_non_streaming_mode",
                                            NON_STREAMING_DEFAULT[self.model_type])),
        )  # fmt: skip
        if not clone:  # its whole prompt is known now: too long is the request's own fault
            self._check_fits(self._prompt(spoken, None, None)[0])
        return spoken

    def _takes_instruct(self) -> bool:
        """VoiceDesign always; CustomVoice at 1.7B (upstream drops it at 0.6B)."""
        if self.model_type == "voice_design":
            return True
        return self.model_type == "custom_voice" and self.model_size != "0b6"

    def _voice(self, voice: str | None) -> str | None:
        if self.model_type != "custom_voice":
            if voice is not None:
                raise RequestError(
                    f"voice {voice!r}: a {self.model_type} checkpoint has no named speakers"
                )
            return None
        known = ", ".join(sorted(self.speakers))
        if voice is None:
            raise RequestError(f"a CustomVoice checkpoint needs a voice (speaker): one of {known}")
        if voice.lower() not in self.speakers:
            raise RequestError(f"unknown voice {voice!r}; this model's voices are {known}")
        return voice.lower()

    def _language(self, language: str | None) -> str:
        name = (language or AUTO).lower()
        if name != AUTO and name not in self.languages:
            known = ", ".join([AUTO, *sorted(self.languages)])
            raise RequestError(f"unknown language {language!r}; this model's languages: {known}")
        return name

    def _rows(self, ids: Sequence[int]) -> np.ndarray:
        return np.asarray(self.text_table[np.asarray(ids, np.int64)], np.float32)

    def _prompt(
        self,
        spoken: Spoken,
        xvector: np.ndarray | None,
        ref_codes: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Upstream's prefill and trailing text rows for one request (its ``generate``, and
        ``generate_icl_prompt`` when a cloned voice brings reference codes)."""
        ids = spoken.ids
        text_ids = ids[3:-5]
        cid = self.ids
        voice = spoken.voice
        lang_id = None if spoken.language == AUTO else self.languages[spoken.language]
        if voice is not None and spoken.language in ("chinese", AUTO) and voice in self.dialects:
            lang_id = self.languages[self.dialects[voice]]
        prefix = (
            [cid["codec_nothink"], cid["codec_think_bos"], cid["codec_think_eos"]]
            if lang_id is None
            else [cid["codec_think"], cid["codec_think_bos"], lang_id, cid["codec_think_eos"]]
        )
        rows = [self.codec_embedding[prefix]]
        if voice is not None:
            rows.append(self.codec_embedding[[self.speakers[voice]]])
        elif xvector is not None:
            rows.append(np.asarray(xvector, np.float32).reshape(1, -1))
        rows.append(self.codec_embedding[[cid["codec_pad"], cid["codec_bos"]]])
        codec = np.concatenate(rows)
        parts = []
        if spoken.instruct is not None:
            parts.append(self._rows(spoken.instruct))
        parts.append(self._rows(ids[:3]))  # <|im_start|>assistant\n
        text_track = np.stack([*[self.tts_pad] * (len(codec) - 2), self.tts_bos])
        parts.append(text_track + codec[:-1])
        if ref_codes is not None:
            icl, trailing = self._icl(spoken, text_ids, ref_codes)
            parts.append(icl)
            return np.concatenate(parts).astype(np.float32), trailing.astype(np.float32)
        body = self._rows(text_ids)
        if spoken.non_streaming:
            whole = np.concatenate([body, self.tts_eos[None]])
            parts.append(whole + self.codec_embedding[cid["codec_pad"]])
            parts.append((self.tts_pad + codec[-1])[None])
            trailing = self.tts_pad[None]
        else:
            parts.append(body[:1] + codec[-1])
            trailing = np.concatenate([body[1:], self.tts_eos[None]])
        return np.concatenate(parts).astype(np.float32), trailing.astype(np.float32)

    def _icl(
        self, spoken: Spoken, text_ids: Sequence[int], ref_codes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """An in-context clone's rows (upstream's ``generate_icl_prompt``): the transcript and
        the text, then tts_eos, over codec_bos and one row per reference frame (the sum of its
        16 code embeddings), added up to the shorter track when streamed."""
        text = np.concatenate([self._rows([*spoken.ref, *text_ids]), self.tts_eos[None]])
        frames = self.codec_embedding[ref_codes[:, 0]].astype(np.float32)
        for group in range(1, self.groups):
            frames = frames + self.cp.embeddings[group - 1][ref_codes[:, group]]
        codec = np.concatenate([self.codec_embedding[[self.ids["codec_bos"]]], frames])
        pad = self.tts_pad[None]
        if spoken.non_streaming:
            icl = np.concatenate([text + self.codec_embedding[self.ids["codec_pad"]], codec + pad])
            return icl, pad
        if len(text) > len(codec):
            return text[: len(codec)] + codec, text[len(codec) :]
        padded = np.concatenate([text, np.repeat(pad, len(codec) - len(text), axis=0)])
        return padded + codec, pad

    # -- the shared loop's hooks -------------------------------------------------------------
    def _plan(self, state: RequestState, events: Sequence[Any]) -> Utterance:
        """The request's rows, from what it asked and what the clone encoders made of its
        ref_audio (their stages ran before this one)."""
        spoken: Spoken = state.prepared[self.stage.id]
        xvector = ref_codes = None
        if spoken.clone:
            xvector = state.outputs.get(self.xvector_source) if self.xvector_source else None
            if xvector is None:
                raise RequestError("no speaker embedding of ref_audio reached the talker")
            if spoken.ref is not None:
                source = self.ref_codes_source
                ref_codes = state.outputs.get(source) if source else None
                if ref_codes is None:
                    raise RequestError("no reference codes of ref_audio reached the talker")
        embeds, trailing = self._prompt(spoken, xvector, ref_codes)
        self._check_fits(embeds)  # a clone's prompt holds its reference: known only now
        return Utterance(state, spoken.voice, embeds, trailing)

    def _check_fits(self, embeds: np.ndarray) -> None:
        """A RequestError when the prompt's rows do not fit the build."""
        if len(embeds) > self.max_input_len:
            raise RequestError(
                f"the prompt is {len(embeds)} positions, over the build's max_input_len "
                f"{self.max_input_len}"
            )
        if len(embeds) >= self.capacity:
            raise RequestError(
                f"the prompt is {len(embeds)} positions; the talker's cache holds {self.capacity}"
            )

    def _prefills(self, plans: Sequence[Utterance]) -> list[Utterance]:
        return list(plans)

    def _text_rows(
        self,
        prefills: Sequence[Utterance],
        steps: Sequence[int],
        active: np.ndarray,
    ) -> np.ndarray:
        """Each row's text input for its decode step: its next trailing row, then tts_pad."""
        rows = np.broadcast_to(self.tts_pad, (len(prefills), self.hidden_size)).copy()
        for row, p in enumerate(prefills):
            if active[row] and steps[row] < len(p.trailing):
                rows[row] = p.trailing[steps[row]]
        return rows
