"""Hugging Face reference outputs of a Qwen3-Omni checkpoint, for parity tests (not a test file).

Everything is greedy: the thinker with ``do_sample=False`` and the talker with
``talker_do_sample=False`` (which transformers mirrors onto the code predictor). The talker keeps
transformers' other defaults, since a runtime that claims parity with ``generate`` has to
reproduce them too: ids ``[vocab - 1024, vocab)`` suppressed except codec EOS, and
repetition_penalty 1.05, which (the talker being prompted with ``inputs_embeds``) applies only to
the codes it has generated so far, not to the prompt.

How codes are captured: ``Qwen3OmniMoeForConditionalGeneration.generate`` returns only text ids
and the waveform. While it runs, ``model.code2wav.chunked_decode`` is shadowed by an instance
attribute that records its ``codes`` argument ([1, 16, frames]: the talker's group-0 code plus
the code predictor's 15 residual codes per frame, exactly what is vocoded) and then calls the
original. ``model.talker.generate`` is wrapped the same way to keep the talker's own token
sequence, and group 0 of the recorded codes is checked against it.

Inputs go through ``AutoProcessor`` where it loads. Its Qwen2-VL image and video processors need
Pillow or torchvision, which this project does not install; without them the same inputs are built
from the processor's parts: the chat template, ``AutoFeatureExtractor`` (Whisper, numpy) and the
tokenizer, with the processor's placeholder expansion and a torch copy of the Qwen2-VL image
processor's fused normalize + patchify, for images whose sides are multiples of
``patch_size * merge_size`` (so its resize is the identity).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

SAMPLE_RATE_IN = 16000
SAMPLE_RATE_OUT = 24000
# transformers' generate() hard-codes these in its call to code2wav.chunked_decode.
CHUNK_SIZE = 300
LEFT_CONTEXT = 25


@dataclass
class OmniReference:
    """One greedy transformers run: what a runtime under test must reproduce."""

    prompt_ids: list[int]  # the thinker's input ids, placeholders expanded
    thinker_tokens: list[int]  # generated ids after the prompt (EOS included when produced)
    text: str  # thinker_tokens decoded without special tokens
    codes: np.ndarray  # int64 [frames, 16]: group 0 from the talker, 1..15 from the predictor
    wav: np.ndarray  # float32 [samples] at 24 kHz, as generate() returned it (chunked decode)
    talker_tokens: list[int]  # the talker's sampled ids: group-0 codes, then EOS if it stopped
    talker_stopped: bool  # True when the talker emitted codec EOS before the frame cap
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # processor outputs (numpy)


@dataclass
class OmniBundle:
    """A loaded checkpoint: model plus whatever builds its inputs."""

    model: Any
    tokenizer: Any
    processor: Any | None  # AutoProcessor, or None where Pillow/torchvision are missing
    feature_extractor: Any
    image_settings: dict[str, Any]  # processor_config.json's image_processor entry


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run tiny models on one intra-op thread, restoring the setting afterwards.

    The ops are microseconds long; with two threads on a shared 2-core machine the thread
    hand-offs made one generate() 10-30x slower (1 s -> 11-38 s measured under load).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_bundle(ckpt: Path) -> OmniBundle:
    """Load the model (float32, eval) and the input builders from ``ckpt``."""
    from transformers import (
        AutoFeatureExtractor,
        AutoProcessor,
        AutoTokenizer,
        Qwen3OmniMoeForConditionalGeneration,
    )

    ckpt = Path(ckpt)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    try:
        processor = AutoProcessor.from_pretrained(ckpt)
    except (ImportError, ValueError):  # "Missing optional dependencies: torchvision, Pillow"
        processor = None
    tokenizer = (
        processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(ckpt)
    )
    feature_extractor = (
        processor.feature_extractor
        if processor is not None
        else AutoFeatureExtractor.from_pretrained(ckpt)
    )
    image_settings = json.loads((ckpt / "processor_config.json").read_text())["image_processor"]
    return OmniBundle(
        model=model,
        tokenizer=tokenizer,
        processor=processor,
        feature_extractor=feature_extractor,
        image_settings=image_settings,
    )


def messages_for(
    prompt: str, *, audio: bool = False, image: bool = False, system: str | None = None
) -> list[dict[str, Any]]:
    """One user turn (media parts first, then the text), optionally after a system turn."""
    content: list[dict[str, Any]] = []
    if audio:
        content.append({"type": "audio", "audio": "<waveform>"})
    if image:
        content.append({"type": "image", "image": "<pixels>"})
    content.append({"type": "text", "text": prompt})
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def num_audio_tokens(mel_frames: int, n_window: int = 50) -> int:
    """The processor's ``_get_feat_extract_output_lengths``: audio-encoder tokens per clip."""
    leave = mel_frames % (n_window * 2)
    feat = (leave - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // (n_window * 2)) * 13


def image_features(image: np.ndarray, settings: dict[str, Any]) -> tuple[torch.Tensor, list[int]]:
    """Qwen2-VL ``pixel_values`` [patches, C*T*P*P] and grid [t, h, w] for one RGB uint8 image.

    Mirrors the torchvision image processor: fused rescale+normalize in float32, then the
    merge-ordered patchify with the frame repeated ``temporal_patch_size`` times. Only sizes that
    its smart_resize leaves unchanged are accepted, so no resampling has to be reproduced.
    """
    p, m, t = settings["patch_size"], settings["merge_size"], settings["temporal_patch_size"]
    h, w, c = image.shape
    lo, hi = settings["size"]["shortest_edge"], settings["size"]["longest_edge"]
    if c != 3 or h % (p * m) or w % (p * m) or not lo <= h * w <= hi:
        raise ValueError(
            f"image {image.shape}: sides must be multiples of {p * m} with {lo} <= h*w <= {hi} "
            "(no resize without Pillow/torchvision)"
        )
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].to(torch.float32)
    scale = 1.0 / settings["rescale_factor"]
    mean = (torch.tensor(settings["image_mean"]) * scale).view(1, 3, 1, 1)
    std = (torch.tensor(settings["image_std"]) * scale).view(1, 3, 1, 1)
    x = (x - mean) / std
    gh, gw = h // p, w // p
    x = x.reshape(1, c, gh // m, m, p, gw // m, m, p).permute(0, 2, 5, 3, 6, 1, 4, 7)
    x = x.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, t, -1, -1)
    return x.reshape(gh * gw, c * t * p * p), [1, gh, gw]


def build_inputs(
    bundle: OmniBundle,
    prompt: str,
    *,
    audio: np.ndarray | None = None,
    image: np.ndarray | None = None,
    system: str | None = None,
) -> dict[str, torch.Tensor]:
    """Chat-template the prompt and run the processor (or its parts) on the optional media.

    ``audio``: mono float waveform at 16 kHz; ``image``: uint8 RGB [H, W, 3].
    """
    messages = messages_for(prompt, audio=audio is not None, image=image is not None, system=system)
    audio_list = None if audio is None else [np.asarray(audio, dtype=np.float32)]
    images = None if image is None else [np.asarray(image, dtype=np.uint8)]
    if bundle.processor is not None:
        text = bundle.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        out = bundle.processor(text=text, audio=audio_list, images=images, return_tensors="pt")
        return dict(out)

    tok = bundle.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    feats: dict[str, torch.Tensor] = {}
    if audio_list is not None:
        fe = bundle.feature_extractor(
            audio_list,
            sampling_rate=SAMPLE_RATE_IN,
            padding=True,
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        feats["input_features"] = fe["input_features"]
        feats["feature_attention_mask"] = fe["attention_mask"]
        n = num_audio_tokens(int(fe["attention_mask"].sum()))
        text = text.replace(tok.audio_token, tok.audio_token * n, 1)
    if images is not None:
        pixels, grid = image_features(images[0], bundle.image_settings)
        feats["pixel_values"] = pixels
        feats["image_grid_thw"] = torch.tensor([grid])
        n = grid[0] * grid[1] * grid[2] // bundle.image_settings["merge_size"] ** 2
        text = text.replace(tok.image_token, tok.image_token * n, 1)
    enc = tok([text], return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], **feats}


@contextlib.contextmanager
def capture_codes(model: Any) -> Iterator[dict[str, torch.Tensor]]:
    """Record code2wav's input codes and the talker's sequences during one ``generate``."""
    seen: dict[str, torch.Tensor] = {}
    decode = model.code2wav.chunked_decode
    talker_generate = model.talker.generate
    shadowed = {  # instance attributes already there (normally none): put back afterwards
        (obj, name): vars(obj)[name]
        for obj, name in ((model.code2wav, "chunked_decode"), (model.talker, "generate"))
        if name in vars(obj)
    }

    def recording_decode(codes: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen["codes"] = codes.detach().clone()
        return decode(codes, *args, **kwargs)

    def recording_generate(*args: Any, **kwargs: Any) -> Any:
        result = talker_generate(*args, **kwargs)
        seen["talker_sequences"] = result.sequences.detach().clone()
        return result

    model.code2wav.chunked_decode = recording_decode
    model.talker.generate = recording_generate
    try:
        yield seen
    finally:
        for obj, name in ((model.code2wav, "chunked_decode"), (model.talker, "generate")):
            if (obj, name) in shadowed:
                setattr(obj, name, shadowed[obj, name])
            else:
                delattr(obj, name)  # the class's method again


def run_reference(
    bundle: OmniBundle,
    inputs: dict[str, torch.Tensor],
    *,
    speaker: str = "ethan",
    max_new_tokens: int = 16,
    max_frames: int = 30,
) -> OmniReference:
    """Greedy thinker -> talker -> code predictor -> code2wav on processed ``inputs`` (batch 1).

    The talker runs ``max_frames + 1`` steps at most: the code predictor fills a frame's 15
    residual codes at the step after its group-0 code, so the last sampled code never gets a frame.
    """
    model, cfg = bundle.model, bundle.model.config
    with single_thread(), capture_codes(model) as seen, torch.no_grad():
        sequences, wav = model.generate(
            **inputs,
            speaker=speaker,
            return_audio=True,
            thinker_max_new_tokens=max_new_tokens,
            thinker_do_sample=False,
            # generate()'s default is the real vocabulary's <|im_end|> (151645)
            thinker_eos_token_id=cfg.im_end_token_id,
            talker_do_sample=False,
            talker_max_new_tokens=max_frames + 1,
        )
    prompt = inputs["input_ids"][0].tolist()
    generated = sequences[0, len(prompt) :].tolist()
    codes = seen["codes"][0].T.numpy().astype(np.int64)
    talker_tokens = seen["talker_sequences"][0].tolist()
    eos = cfg.talker_config.codec_eos_token_id
    if codes[:, 0].tolist() != talker_tokens[: codes.shape[0]]:
        raise AssertionError("group-0 codes differ from the talker's sequence")
    return OmniReference(
        prompt_ids=prompt,
        thinker_tokens=generated,
        text=bundle.tokenizer.decode(generated, skip_special_tokens=True),
        codes=codes,
        wav=wav.reshape(-1).float().numpy().astype(np.float32),
        talker_tokens=talker_tokens,
        talker_stopped=eos in talker_tokens,
        inputs={k: v.numpy() for k, v in inputs.items() if isinstance(v, torch.Tensor)},
    )


def reference_text(bundle: OmniBundle, prompt: str, **kwargs: Any) -> OmniReference:
    """(a) Text-only input."""
    return run_reference(bundle, build_inputs(bundle, prompt), **kwargs)


def reference_audio(
    bundle: OmniBundle, waveform: np.ndarray, prompt: str = "Listen.", **kwargs: Any
) -> OmniReference:
    """(b) A 16 kHz mono waveform plus a text prompt."""
    return run_reference(bundle, build_inputs(bundle, prompt, audio=waveform), **kwargs)


def reference_image(
    bundle: OmniBundle, image: np.ndarray, prompt: str = "Describe it.", **kwargs: Any
) -> OmniReference:
    """(c) A uint8 RGB image [H, W, 3] plus a text prompt."""
    return run_reference(bundle, build_inputs(bundle, prompt, image=image), **kwargs)


def chunked_wav_length(frames: int, samples_per_frame: int, lost_per_chunk: int) -> int:
    """Samples generate() returns for ``frames`` codes: every 300-frame chunk (decoded with up to
    25 frames of left context, which are cut off) loses ``lost_per_chunk`` trailing samples."""
    chunks = -(-frames // CHUNK_SIZE)
    return frames * samples_per_frame - chunks * lost_per_chunk


def whole_utterance_wav(model: Any, codes: np.ndarray) -> np.ndarray:
    """code2wav on all ``codes`` [frames, 16] in one pass: float32 [frames * 1920 - 555].

    transformers' generate() instead calls ``chunked_decode(codes, chunk_size=300,
    left_context_size=25)``: chunks of 300 frames, each decoded after up to 25 frames of left
    context whose samples are cut off. Qwen3-Omni's transposed convs trim both sides, so every
    chunk comes out 555 samples short of n * 1920: one-pass samples [k*576000 - 555, k*576000) are
    missing at each join k, and the next chunk resumes at k*576000 (on this tiny model, equal to
    the one pass within ~1e-5, since 25 frames cover its receptive field; the real model's
    72-frame attention window is wider). Up to 300 frames both are the same call, bit for bit.
    """
    x = torch.from_numpy(np.asarray(codes, dtype=np.int64)).T[None]
    with single_thread(), torch.no_grad():
        wav = model.code2wav(x)
    return wav.reshape(-1).float().numpy().astype(np.float32)


def engine_with_vocoder(engine: Path, dest: Path, **config: int) -> Path:
    """A copy of an engine dir whose code2wav stage's graph config is ``config`` (vocoder
    windows for a test)."""
    import shutil

    shutil.copytree(engine, dest)
    graph = json.loads((dest / "multistage_config.json").read_text())
    next(s for s in graph["stages"] if s["id"] == "code2wav")["config"] = config
    (dest / "multistage_config.json").write_text(json.dumps(graph))
    return dest
